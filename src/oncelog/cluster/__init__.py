"""Cluster mode: the coordination service (ZooKeeper) brokers keep their metadata on, and what runs on it."""
