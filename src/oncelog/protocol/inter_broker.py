"""Codecs of the inter-broker requests kafka-python has no schema for (Kafka's own wire layout).

ControlledShutdown (API key 7, v3: broker id and broker epoch; the answer lists the partitions the broker still
leads): a broker asks the controller to move its leaderships away before it stops (docs/cluster.md §5.2). Brokers
accept it without advertising it in ApiVersions: clients have no use for it.
"""

from __future__ import annotations

import kafka.protocol.api_message as _api_message

from . import schemas as _schemas


class ControlledShutdownRequest(_api_message.ApiMessage, load_json=_schemas):
    pass


class ControlledShutdownResponse(_api_message.ApiMessage, load_json=_schemas):
    pass


__all__ = ["ControlledShutdownRequest", "ControlledShutdownResponse"]
