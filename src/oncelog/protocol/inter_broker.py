"""Codecs of the inter-broker requests kafka-python has no schema for (Kafka's own wire layout).

ControlledShutdown (API key 7, v3: broker id and broker epoch; the answer lists the partitions the broker still
leads): a broker asks the controller to move its leaderships away before it stops (docs/cluster.md §5.2).

FetchSnapshot (API key 59, v0): in Kafka, a KRaft voter copying the metadata log's snapshot. Here a follower whose
log starts over (added by reassignment, a lost disk) takes its leader's producer-state snapshot with it
(docs/cluster.md §4.7): the same request and response layout, a partition's producer state as the snapshot.

Brokers accept both without advertising them in ApiVersions: clients have no use for them.
"""

from __future__ import annotations

import kafka.protocol.api_message as _api_message

from . import schemas as _schemas


class ControlledShutdownRequest(_api_message.ApiMessage, load_json=_schemas):
    pass


class ControlledShutdownResponse(_api_message.ApiMessage, load_json=_schemas):
    pass


class FetchSnapshotRequest(_api_message.ApiMessage, load_json=_schemas):
    pass


class FetchSnapshotResponse(_api_message.ApiMessage, load_json=_schemas):
    pass


__all__ = ["ControlledShutdownRequest", "ControlledShutdownResponse", "FetchSnapshotRequest", "FetchSnapshotResponse"]
