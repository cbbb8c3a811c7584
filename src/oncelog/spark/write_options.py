"""Options of the `oncelog` sink (batch and streaming writes), named like Spark's Kafka sink.

`kafka.bootstrap.servers` (or `bootstrap.servers`), `topic` (else a `topic` column per row), and the rows'
columns as Spark's Kafka sink reads them: `value` (required), `key`, `topic`, `partition`, `headers`. The
options of our own are `sink.id` (the stable name the transactional ids and batch markers derive from),
`sink.markerTopic` and `transaction.timeout.ms`. Other `kafka.*` options are producer settings with Kafka's
names; the ones the exactly-once protocol decides itself are refused, so a user cannot quietly weaken it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oncelog.client.config import ClientConfig
from oncelog.spark.options import OptionError, admin_settings

DEFAULT_MARKER_TOPIC = "oncelog-sink-markers"
DEFAULT_TRANSACTION_TIMEOUT_MS = 60000

_RESERVED = {
    "transactional.id": "the sink derives one transactional id per (sink.id, Spark partition)",
    "enable.idempotence": "exactly-once writes need the idempotent producer",
    "acks": "exactly-once writes need acks=all",
    "key.serializer": "keys are written as binary (a string column is UTF-8 encoded)",
    "value.serializer": "values are written as binary (a string column is UTF-8 encoded)",
}
# Names that end up inside transactional ids and group ids: keep them printable and unambiguous.
_SINK_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


@dataclass(frozen=True)
class WriteOptions:
    bootstrap_servers: str
    #: the `topic` option: every row goes there (it overrides a `topic` column, as in Spark's Kafka sink)
    topic: str | None
    #: the `sink.id` option; None means "the streaming query's id" (stable for the life of its checkpoint)
    sink_id: str | None
    marker_topic: str
    transaction_timeout_ms: int
    #: the checkpoint of a streaming query (Spark passes it to the writer as an option)
    checkpoint_location: str | None
    #: producer settings from `kafka.*` options (bootstrap servers excluded)
    client: dict[str, str] = field(default_factory=dict)

    def producer_config(self, transactional_id: str) -> dict[str, str]:
        return {**self.client, "bootstrap.servers": self.bootstrap_servers, "transactional.id": transactional_id,
                "transaction.timeout.ms": str(self.transaction_timeout_ms)}

    def admin_config(self) -> dict[str, Any]:
        return admin_settings(self.client, self.bootstrap_servers, "producer")


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Validate a writer's options (keys in any case, as Spark passes them)."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    bootstrap = opts.get("kafka.bootstrap.servers") or opts.get("bootstrap.servers")
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' (or 'bootstrap.servers') is required, "
                          "e.g. '127.0.0.1:9092'")
    for read_only in ("subscribe", "assign", "subscribepattern", "startingoffsets", "endingoffsets"):
        if read_only in opts:
            raise OptionError(f"option '{read_only}' is for reading; a write takes 'topic' or a topic column")
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option 'topic' is empty")
    sink_id = opts.get("sink.id")
    if sink_id is not None and not _SINK_ID.match(sink_id):
        raise OptionError(f"option 'sink.id' must be 1-200 characters of letters, digits, '.', '_' or '-'; "
                          f"got {sink_id!r}")
    marker_topic = opts.get("sink.markertopic", DEFAULT_MARKER_TOPIC)
    if not _SINK_ID.match(marker_topic):
        raise OptionError(f"option 'sink.markerTopic' is not a valid topic name: {marker_topic!r}")
    timeout = opts.get("transaction.timeout.ms") or opts.get("kafka.transaction.timeout.ms")
    timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS
    if timeout is not None:
        try:
            timeout_ms = int(timeout)
        except ValueError:
            raise OptionError(f"option 'transaction.timeout.ms' must be an integer; got {timeout!r}") from None
        if timeout_ms <= 0:
            raise OptionError(f"option 'transaction.timeout.ms' must be positive; got {timeout_ms}")
    client = {}
    for key, value in opts.items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka."):]
        if name in ("bootstrap.servers", "transaction.timeout.ms"):
            continue
        if name in _RESERVED:
            raise OptionError(f"option '{key}' is not supported: {_RESERVED[name]}")
        client[name] = value
    try:  # a misspelt or consumer-only setting fails here, named; aliases (sasl.mechanisms, ...) are fine
        given = ClientConfig({**client, "bootstrap.servers": bootstrap}, "producer")
    except ValueError as exc:
        raise OptionError(f"a kafka.* option is not a valid producer setting: {exc}") from None
    for name, why in _RESERVED.items():
        if name in given:  # given under another name (request.required.acks is acks)
            raise OptionError(f"option 'kafka.{name}' (given by another name) is not supported: {why}")
    return WriteOptions(
        bootstrap_servers=bootstrap,
        topic=topic.strip() if topic is not None else None,
        sink_id=sink_id,
        marker_topic=marker_topic,
        transaction_timeout_ms=timeout_ms,
        checkpoint_location=opts.get("checkpointlocation") or None,
        client=client,
    )
