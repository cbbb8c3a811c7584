"""Cluster metadata on ZooKeeper, in rooms (docs/metadata-store.md): the facade `cluster.metadata_store` composes
them; only this package and the facade import kazoo."""
