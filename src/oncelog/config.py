"""Broker and topic configuration with Kafka's key names.

Kafka users bring `server.properties` files and `--config` habits with them, so keys,
units and defaults follow Kafka; oncelog-only keys carry an `oncelog.` prefix.
Every limit the broker enforces is a key here, validated at startup: a typo or an
out-of-range value stops the broker with a clear message instead of being ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .security.listeners import (
    ListenerError,
    inter_broker_listener,
    is_listener_key,
    listener_specs,
    split_listener_key,
)
from .security.quotas import parse_ip_overrides

LONG_MAX = 9223372036854775807
INT_MAX = 2147483647

# Config types as DescribeConfigs v3+ reports them.
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_SHORT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 1, 2, 3, 4, 5, 6, 7
TYPE_PASSWORD = 9


class ConfigError(ValueError):
    """A configuration key or value the broker refuses."""


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: int
    default: Any
    doc: str
    validator: Callable[[Any], str | None] | None = None
    # For topic keys: the broker key that supplies the default.
    broker_synonym: str | None = None
    # Passwords, keys and JAAS configs: DescribeConfigs reports them as null with is_sensitive, as Kafka does.
    sensitive: bool = False

    def parse(self, raw: Any) -> Any:
        value = _coerce(self, raw)
        if self.validator is not None:
            problem = self.validator(value)
            if problem:
                raise ConfigError(f"Invalid value {raw!r} for configuration {self.name}: {problem}")
        return value

    def render(self, value: Any) -> str | None:
        if value is None:
            return None
        if self.type == TYPE_BOOLEAN:
            return "true" if value else "false"
        if self.type == TYPE_LIST:
            return ",".join(value)
        return str(value)


def _coerce(key: ConfigKey, raw: Any) -> Any:
    if raw is None:
        return None
    try:
        if key.type == TYPE_BOOLEAN:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text not in ("true", "false"):
                raise ValueError("expected true or false")
            return text == "true"
        if key.type in (TYPE_INT, TYPE_SHORT, TYPE_LONG):
            text = str(raw).strip()
            if not text.lstrip("+-").isdigit():
                raise ValueError("expected a whole number")
            value = int(text)
            limit = {TYPE_INT: INT_MAX, TYPE_SHORT: 32767, TYPE_LONG: LONG_MAX}[key.type]
            if not -limit - 1 <= value <= limit:
                raise ValueError("out of range for its type")
            return value
        if key.type == TYPE_DOUBLE:
            try:
                return float(str(raw).strip())
            except ValueError:
                raise ValueError("expected a number") from None
        if key.type == TYPE_LIST:
            if isinstance(raw, (list, tuple)):
                return [str(x).strip() for x in raw if str(x).strip()]
            return [part.strip() for part in str(raw).split(",") if part.strip()]
        return str(raw).strip()
    except ValueError as exc:
        raise ConfigError(f"Invalid value {raw!r} for configuration {key.name}: {exc}") from None


# Below this a controller seat would be lost to ordinary pauses of a Python process (GC, a loaded machine), and
# ZooKeeper raises any request below two ticks of its tickTime anyway (the development service's tick is 500 ms).
MIN_CONTROLLER_SESSION_MS = 1000


def at_least(minimum: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= minimum else f"must be at least {minimum}"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be greater than 0"


def fraction(v: float) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


def between(low: int, high: int, *also: int) -> Callable[[Any], str | None]:
    extra = "".join(f" or {v}" for v in also)
    return lambda v: None if low <= v <= high or v in also else f"must be between {low} and {high}{extra}"


def list_of(*choices: str) -> Callable[[Any], str | None]:
    def check(values: list[str]) -> str | None:
        bad = [v for v in values if v not in choices]
        if bad or not values:
            return f"each item must be one of {', '.join(choices)}"
        return None

    return check


COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")

TOPIC_KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in [
        ConfigKey("cleanup.policy", TYPE_LIST, ["delete"], "Delete old segments, compact by key, or both.",
                  list_of("delete", "compact"), "log.cleanup.policy"),
        ConfigKey("compression.type", TYPE_STRING, "producer", "Codec the topic keeps; 'producer' keeps the producer's.",
                  one_of(*COMPRESSION_TYPES), "compression.type"),
        # KIP-390: the level the broker compresses with when it recompresses to compression.type.
        ConfigKey("compression.gzip.level", TYPE_INT, -1, "gzip level of batches the broker recompresses; -1: 6.",
                  between(1, 9, -1), "compression.gzip.level"),
        ConfigKey("compression.lz4.level", TYPE_INT, 9, "lz4 level of batches the broker recompresses (9: fast).",
                  between(1, 17), "compression.lz4.level"),
        ConfigKey("compression.zstd.level", TYPE_INT, 3, "zstd level of batches the broker recompresses.",
                  between(-131072, 22), "compression.zstd.level"),
        ConfigKey("max.message.bytes", TYPE_INT, 1048588, "Largest record batch the topic accepts.",
                  at_least(0), "message.max.bytes"),
        ConfigKey("message.timestamp.type", TYPE_STRING, "CreateTime", "CreateTime or LogAppendTime.",
                  one_of("CreateTime", "LogAppendTime"), "log.message.timestamp.type"),
        ConfigKey("message.timestamp.before.max.ms", TYPE_LONG, LONG_MAX,
                  "How far in the past a record's CreateTime may be.", at_least(0),
                  "log.message.timestamp.before.max.ms"),
        ConfigKey("message.timestamp.after.max.ms", TYPE_LONG, LONG_MAX,
                  "How far in the future a record's CreateTime may be.", at_least(0),
                  "log.message.timestamp.after.max.ms"),
        ConfigKey("retention.ms", TYPE_LONG, 604800000, "Age after which a closed segment is deleted; -1: never.",
                  at_least(-1), "log.retention.ms"),
        ConfigKey("retention.bytes", TYPE_LONG, -1, "Size above which the oldest segments are deleted; -1: none.",
                  at_least(-1), "log.retention.bytes"),
        ConfigKey("segment.bytes", TYPE_INT, 1073741824, "Size at which the active segment is rolled.",
                  at_least(14), "log.segment.bytes"),
        ConfigKey("segment.ms", TYPE_LONG, 604800000, "Age at which the active segment is rolled.",
                  at_least(1), "log.roll.ms"),
        ConfigKey("segment.index.bytes", TYPE_INT, 10485760, "Largest offset index of a segment.",
                  at_least(8), "log.index.size.max.bytes"),
        ConfigKey("index.interval.bytes", TYPE_INT, 4096, "Bytes between two offset index entries.",
                  at_least(0), "log.index.interval.bytes"),
        ConfigKey("min.insync.replicas", TYPE_INT, 1, "In-sync replicas an acks=all write needs (1 on a single node).",
                  at_least(1), "min.insync.replicas"),
        ConfigKey("unclean.leader.election.enable", TYPE_BOOLEAN, False,
                  "Elect a replica outside the ISR when no in-sync replica is alive (may lose acknowledged data).",
                  None, "unclean.leader.election.enable"),
        ConfigKey("file.delete.delay.ms", TYPE_LONG, 60000,
                  "How long a deleted segment's files stay on disk as <name>.deleted before they are unlinked.",
                  at_least(0), "log.segment.delete.delay.ms"),
        # Log compaction (storage/cleaner/, docs/log-cleaner.md).
        ConfigKey("delete.retention.ms", TYPE_LONG, 86400000,
                  "How long a tombstone or a transaction marker stays once the cleaner has seen it (its delete "
                  "horizon).", at_least(0), "log.cleaner.delete.retention.ms"),
        ConfigKey("min.cleanable.dirty.ratio", TYPE_DOUBLE, 0.5,
                  "Share of the log not yet cleaned above which the cleaner takes it.", fraction,
                  "log.cleaner.min.cleanable.ratio"),
        ConfigKey("min.compaction.lag.ms", TYPE_LONG, 0, "Records younger than this are not cleaned.",
                  at_least(0), "log.cleaner.min.compaction.lag.ms"),
        ConfigKey("max.compaction.lag.ms", TYPE_LONG, LONG_MAX,
                  "A record older than this is cleaned whatever the dirty ratio (KIP-354).", at_least(1),
                  "log.cleaner.max.compaction.lag.ms"),
    ]
}


def _ip_overrides_problem(text: str) -> str | None:
    try:
        parse_ip_overrides(text)
    except ValueError as exc:
        return str(exc)
    return None


def _broker_keys() -> dict[str, ConfigKey]:
    keys = [
        ConfigKey("node.id", TYPE_INT, 0, "This broker's id.", at_least(0)),
        ConfigKey("num.partitions", TYPE_INT, 1, "Partitions of an auto-created topic.", at_least(1)),
        ConfigKey("default.replication.factor", TYPE_SHORT, 1,
                  "Replication factor of topics created without one (1 on a single node).", at_least(1)),
        ConfigKey("auto.create.topics.enable", TYPE_BOOLEAN, True, "Create a topic on first Metadata request."),
        ConfigKey("delete.topic.enable", TYPE_BOOLEAN, True, "Allow DeleteTopics."),
        ConfigKey("log.cleanup.policy", TYPE_LIST, ["delete"], "Default cleanup.policy.", list_of("delete", "compact")),
        ConfigKey("compression.type", TYPE_STRING, "producer", "Default compression.type.", one_of(*COMPRESSION_TYPES)),
        ConfigKey("compression.gzip.level", TYPE_INT, -1, "Default compression.gzip.level.", between(1, 9, -1)),
        ConfigKey("compression.lz4.level", TYPE_INT, 9, "Default compression.lz4.level.", between(1, 17)),
        ConfigKey("compression.zstd.level", TYPE_INT, 3, "Default compression.zstd.level.", between(-131072, 22)),
        ConfigKey("message.max.bytes", TYPE_INT, 1048588, "Default max.message.bytes.", at_least(0)),
        ConfigKey("log.message.timestamp.type", TYPE_STRING, "CreateTime", "Default message.timestamp.type.",
                  one_of("CreateTime", "LogAppendTime")),
        ConfigKey("log.message.timestamp.before.max.ms", TYPE_LONG, LONG_MAX,
                  "Default message.timestamp.before.max.ms.", at_least(0)),
        ConfigKey("log.message.timestamp.after.max.ms", TYPE_LONG, LONG_MAX,
                  "Default message.timestamp.after.max.ms.", at_least(0)),
        ConfigKey("log.retention.ms", TYPE_LONG, None, "Default retention.ms (overrides minutes and hours).",
                  at_least(-1)),
        ConfigKey("log.retention.minutes", TYPE_INT, None, "Default retention in minutes.", at_least(-1)),
        ConfigKey("log.retention.hours", TYPE_INT, 168, "Default retention in hours.", at_least(-1)),
        ConfigKey("log.retention.bytes", TYPE_LONG, -1, "Default retention.bytes.", at_least(-1)),
        ConfigKey("log.retention.check.interval.ms", TYPE_LONG, 300000, "How often retention runs.", at_least(1)),
        ConfigKey("log.segment.bytes", TYPE_INT, 1073741824, "Default segment.bytes.", at_least(14)),
        ConfigKey("log.roll.ms", TYPE_LONG, None, "Default segment.ms (overrides log.roll.hours).", at_least(1)),
        ConfigKey("log.roll.hours", TYPE_INT, 168, "Default segment age in hours.", at_least(1)),
        ConfigKey("log.index.size.max.bytes", TYPE_INT, 10485760, "Default segment.index.bytes.", at_least(8)),
        ConfigKey("log.index.interval.bytes", TYPE_INT, 4096, "Default index.interval.bytes.", at_least(0)),
        ConfigKey("log.segment.delete.delay.ms", TYPE_LONG, 60000, "Default file.delete.delay.ms.", at_least(0)),
        ConfigKey("log.cleaner.enable", TYPE_BOOLEAN, True,
                  "Run the log cleaner on topics with cleanup.policy compact (every replica cleans its own copy)."),
        ConfigKey("log.cleaner.threads", TYPE_INT, 1,
                  "Worker processes that clean (the copy parses every record, so it runs outside the broker's "
                  "process).", at_least(1)),
        ConfigKey("log.cleaner.backoff.ms", TYPE_LONG, 15000, "Pause of the cleaner when nothing is cleanable.",
                  at_least(0)),
        ConfigKey("log.cleaner.dedupe.buffer.size", TYPE_LONG, 134217728,
                  "Offset map budget of one round, in bytes (24 bytes a key, as Kafka counts it).",
                  at_least(1024 * 1024)),
        ConfigKey("log.cleaner.io.max.bytes.per.second", TYPE_DOUBLE, 1.7976931348623157e308,
                  "Bytes a second the cleaner may read and write, all workers together (each gets its share).",
                  positive),
        ConfigKey("log.cleaner.min.cleanable.ratio", TYPE_DOUBLE, 0.5, "Default min.cleanable.dirty.ratio.",
                  fraction),
        ConfigKey("log.cleaner.delete.retention.ms", TYPE_LONG, 86400000, "Default delete.retention.ms.",
                  at_least(0)),
        ConfigKey("log.cleaner.min.compaction.lag.ms", TYPE_LONG, 0, "Default min.compaction.lag.ms.", at_least(0)),
        ConfigKey("log.cleaner.max.compaction.lag.ms", TYPE_LONG, LONG_MAX, "Default max.compaction.lag.ms.",
                  at_least(1)),
        ConfigKey("min.insync.replicas", TYPE_INT, 1,
                  "Default min.insync.replicas: in-sync replicas an acks=all write needs.", at_least(1)),
        ConfigKey("log.flush.offset.checkpoint.interval.ms", TYPE_INT, 60000,
                  "How often the recovery point of every partition is checkpointed.", at_least(1)),
        ConfigKey("socket.request.max.bytes", TYPE_INT, 104857600, "Largest request frame accepted.", at_least(1)),
        ConfigKey("max.connections", TYPE_INT, 1000, "Open client connections allowed at once.", at_least(1)),
        ConfigKey("max.connections.per.ip", TYPE_INT, INT_MAX,
                  "Open connections allowed from one IP address; a connection above it is closed (0: only the "
                  "addresses of max.connections.per.ip.overrides may connect).", at_least(0)),
        ConfigKey("max.connections.per.ip.overrides", TYPE_STRING, "",
                  "host:count,... exceptions to max.connections.per.ip (a host name is resolved at start).",
                  _ip_overrides_problem),
        ConfigKey("max.connection.creation.rate", TYPE_INT, INT_MAX,
                  "New connections a second the broker takes; one above the rate waits unread (at most "
                  "quota.window.size.seconds), and the ones after it wait behind it, as Kafka's acceptor.",
                  at_least(0)),
        ConfigKey("quota.window.num", TYPE_INT, 11,
                  "Samples client quotas and max.connection.creation.rate measure their rates over.", at_least(1)),
        ConfigKey("quota.window.size.seconds", TYPE_INT, 1, "Length of one such sample, in seconds.", at_least(1)),
        ConfigKey("queued.max.requests", TYPE_INT, 500,
                  "Requests of one connection in progress before the broker stops reading from it.", at_least(1)),
        ConfigKey("connections.max.idle.ms", TYPE_LONG, 600000, "Idle connections are closed after this.",
                  at_least(1)),
        ConfigKey("fetch.max.bytes", TYPE_INT, 57671680, "Upper bound on a Fetch response's records.", at_least(0)),
        ConfigKey("producer.id.expiration.ms", TYPE_INT, 86400000,
                  "Idle time after which a producer's state is dropped.", at_least(1)),
        ConfigKey("producer.id.expiration.check.interval.ms", TYPE_INT, 600000,
                  "How often idle producer state is looked for.", at_least(1)),
        ConfigKey("transactional.id.expiration.ms", TYPE_INT, 604800000,
                  "Idle time after which a transactional id is forgotten.", at_least(1)),
        ConfigKey("transaction.max.timeout.ms", TYPE_INT, 900000, "Largest transaction timeout allowed.",
                  at_least(1)),
        ConfigKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", TYPE_INT, 10000,
                  "How often timed-out transactions are aborted.", at_least(1)),
        ConfigKey("transaction.remove.expired.transaction.cleanup.interval.ms", TYPE_INT, 3600000,
                  "How often expired transactional ids are removed.", at_least(1)),
        ConfigKey("transaction.state.log.num.partitions", TYPE_INT, 50, "Partitions of __transaction_state.",
                  at_least(1)),
        ConfigKey("offsets.topic.num.partitions", TYPE_INT, 50, "Partitions of __consumer_offsets.", at_least(1)),
        ConfigKey("offsets.retention.minutes", TYPE_INT, 10080, "How long offsets of an empty group are kept.",
                  at_least(1)),
        ConfigKey("offsets.retention.check.interval.ms", TYPE_LONG, 600000,
                  "How often expired committed offsets are removed.", at_least(1)),
        ConfigKey("offset.metadata.max.bytes", TYPE_INT, 4096, "Largest metadata string of a committed offset.",
                  at_least(0)),
        ConfigKey("group.max.size", TYPE_INT, INT_MAX, "Most members one consumer group may have.", at_least(1)),
        ConfigKey("group.initial.rebalance.delay.ms", TYPE_INT, 3000, "Wait for more members on a new group.",
                  at_least(0)),
        ConfigKey("group.min.session.timeout.ms", TYPE_INT, 6000, "Smallest session timeout allowed.", at_least(0)),
        ConfigKey("group.max.session.timeout.ms", TYPE_INT, 1800000, "Largest session timeout allowed.",
                  at_least(0)),
        # Cluster mode (docs/cluster.md); unset oncelog.coordination.connect = the single node.
        ConfigKey("oncelog.coordination.connect", TYPE_STRING, "",
                  "ZooKeeper connect string host:port[,host:port...][/chroot] (default chroot /oncelog). "
                  "Empty: a single node without replication."),
        ConfigKey("oncelog.coordination.session.timeout.ms", TYPE_INT, 9000,
                  "ZooKeeper session timeout: how long a dead or paused broker keeps its registration and "
                  "leaderships.", at_least(1)),
        ConfigKey("oncelog.controller.session.timeout.ms", TYPE_INT, 1500,
                  "ZooKeeper session timeout of the controller seat (a second, shorter session of each broker): how "
                  "long a dead or paused controller keeps the seat before another broker takes it. At most "
                  "oncelog.coordination.session.timeout.ms; ZooKeeper clamps it to [2, 20] ticks of its tickTime "
                  "(KRaft's controller.quorum.election.timeout.ms is 1000).", at_least(MIN_CONTROLLER_SESSION_MS)),
        ConfigKey("oncelog.controller.broker.probe.interval.ms", TYPE_INT, 500,
                  "How often the active controller connects to each other broker's registered address. Two refused "
                  "connections in a row (nothing listens: the process is gone) and it removes that broker's "
                  "registration without waiting for its session to expire; timeouts prove nothing and are left to "
                  "the session. 0 turns the probe off.", at_least(0)),
        # ZooKeeper credentials and znode ACLs (cluster/store/znode_acls.py, docs/security.md §9). The last three
        # are JVM system properties in Kafka; oncelog, having no JVM, takes them as keys (and from KAFKA_OPTS).
        ConfigKey("zookeeper.set.acl", TYPE_BOOLEAN, False,
                  "Create every znode with ACLs: the brokers' ZooKeeper identity all permissions, everyone else read "
                  "(nothing under /config/users, /config/brokers, /delegation_token). Needs ZooKeeper credentials."),
        ConfigKey("java.security.auth.login.config", TYPE_STRING, "",
                  "JAAS file whose Client section (org.apache.zookeeper.server.auth.DigestLoginModule username, "
                  "password) logs the broker in to ZooKeeper with SASL DIGEST-MD5."),
        ConfigKey("zookeeper.sasl.client", TYPE_BOOLEAN, True,
                  "Log in to ZooKeeper with SASL when the JAAS file has the section (false with the section present "
                  "is refused, as Kafka refuses it)."),
        ConfigKey("zookeeper.sasl.clientconfig", TYPE_STRING, "Client",
                  "Section of the JAAS file holding the ZooKeeper login."),
        ConfigKey("oncelog.coordination.connection.timeout.ms", TYPE_INT, 60000,
                  "How long a starting broker retries an unreachable coordination service before it gives up "
                  "(Kafka's zookeeper.connection.timeout.ms).", at_least(1)),
        ConfigKey("replica.lag.time.max.ms", TYPE_LONG, 30000,
                  "A follower that has not caught up for this long is removed from the ISR.", at_least(1)),
        ConfigKey("unclean.leader.election.enable", TYPE_BOOLEAN, False,
                  "Elect a replica outside the ISR when no in-sync replica is alive (may lose acknowledged data)."),
        ConfigKey("offsets.topic.replication.factor", TYPE_SHORT, 3,
                  "Replication factor of __consumer_offsets; its creation waits until that many brokers are alive.",
                  at_least(1)),
        ConfigKey("transaction.state.log.replication.factor", TYPE_SHORT, 3,
                  "Replication factor of __transaction_state; its creation waits until that many brokers are alive.",
                  at_least(1)),
        ConfigKey("transaction.state.log.min.isr", TYPE_INT, 2, "min.insync.replicas of __transaction_state.",
                  at_least(1)),
        ConfigKey("offsets.topic.segment.bytes", TYPE_INT, 104857600,
                  "segment.bytes of __consumer_offsets, set when it is created: small enough that its segments "
                  "close and the cleaner compacts them.", at_least(14)),
        ConfigKey("transaction.state.log.segment.bytes", TYPE_INT, 104857600,
                  "segment.bytes of __transaction_state, set when it is created.", at_least(14)),
        ConfigKey("auto.leader.rebalance.enable", TYPE_BOOLEAN, True,
                  "The controller moves leaderships back to preferred replicas when brokers are imbalanced."),
        ConfigKey("leader.imbalance.check.interval.seconds", TYPE_LONG, 300,
                  "How often the controller checks leader imbalance.", at_least(1)),
        ConfigKey("leader.imbalance.per.broker.percentage", TYPE_INT, 10,
                  "Share of a broker's preferred leaderships led elsewhere above which they are moved back.",
                  at_least(0)),
        ConfigKey("controlled.shutdown.enable", TYPE_BOOLEAN, True,
                  "On shutdown, ask the controller to move this broker's leaderships away first."),
        ConfigKey("controlled.shutdown.max.retries", TYPE_INT, 3,
                  "Further attempts at a controlled shutdown that left leaderships here.", at_least(0)),
        ConfigKey("controlled.shutdown.retry.backoff.ms", TYPE_LONG, 5000,
                  "Pause between controlled shutdown attempts.", at_least(0)),
        ConfigKey("replica.fetch.max.bytes", TYPE_INT, 1048576,
                  "Bytes a follower asks for per partition in one fetch.", at_least(0)),
        ConfigKey("replica.fetch.response.max.bytes", TYPE_INT, 10485760,
                  "Bytes a follower asks for in one fetch response.", at_least(0)),
        ConfigKey("replica.fetch.wait.max.ms", TYPE_INT, 500,
                  "Longest a follower's fetch waits on the leader for data.", at_least(0)),
        ConfigKey("replica.fetch.backoff.ms", TYPE_INT, 1000, "Pause of a follower after a failed fetch.",
                  at_least(0)),
        ConfigKey("replica.socket.timeout.ms", TYPE_INT, 30000, "Timeout of a follower's fetch requests.",
                  at_least(1)),
        ConfigKey("oncelog.loop.stall.threshold.ms", TYPE_INT, 50,
                  "An event loop stall at least this long is logged (WARNING, oncelog.loop) with the stack the "
                  "loop was in and any garbage collection during it, and counted in oncelog_event_loop_stalls; "
                  "0: stalls are not watched (the lag histogram stays).", at_least(0)),
        ConfigKey("oncelog.fsync.enable", TYPE_BOOLEAN, True,
                  "fsync before acknowledging acks=all and before data becomes visible to consumers. "
                  "Turning it off trades durability against power loss for speed."),
        ConfigKey("oncelog.fsync.threads", TYPE_INT, 1,
                  "How many group-commit rounds may be in flight at once, each on a thread of its own; a partition "
                  "is in at most one. 1: one round at a time (a partition written during a round waits for it). "
                  "Measured at 10 MB/s over 4 partitions on ext4, 2 did not lower the broker's produce latency "
                  "(the journal commits one round at a time anyway), so 1 is the default (docs/latency.md).",
                  at_least(1)),
        ConfigKey("oncelog.fsync.method", TYPE_STRING, "fdatasync",
                  "How a group-commit round with more than one file makes them durable. fdatasync: each file on "
                  "its own (each pays a device cache flush: the round grows with the partitions it covers). "
                  "syncfs: one syncfs per filesystem for the whole round (measured 0.41 against 2.2 ms for 16 "
                  "files, docs/latency.md), which also writes whatever else is dirty on that filesystem: for a data "
                  "directory on a filesystem of its own. Needs Linux 5.8 or later (where syncfs reports I/O "
                  "errors); refused at start elsewhere.", one_of("fdatasync", "syncfs")),
        ConfigKey("oncelog.fsync.slow.round.ms", TYPE_INT, 50,
                  "A group-commit fsync round at least this long is logged (WARNING, oncelog.storage.flusher) with "
                  "the disk's share of it and its slowest partition: every acks=all answer the round covers waited "
                  "for it. All rounds are timed in oncelog_fsync_round_seconds and oncelog_fsync_disk_seconds. "
                  "0: no log line.", at_least(0)),
        ConfigKey("oncelog.test.fail.fsync.file", TYPE_STRING, "",
                  "TEST ONLY (fault injection): while the named file exists, every fsync of partition data "
                  "fails with EIO. Empty: off."),
        ConfigKey("oncelog.test.crash.at", TYPE_STRING, "",
                  "TEST ONLY (fault injection): the broker SIGKILLs itself at this step of a multi-step file "
                  "operation (swap-staged, swap-committed, swap-old-deleted: the cleaner's swap). Empty: off."),
        *_security_keys(),
    ]
    return {k.name: k for k in keys}


def _security_keys() -> list[ConfigKey]:
    """Listeners, TLS, SASL and the authorizer, under Kafka's names (docs/security.md). With none of them set
    the broker has one PLAINTEXT listener and no authorizer, as it always had."""
    tls_versions = ("TLSv1.2", "TLSv1.3")
    return [
        ConfigKey("listeners", TYPE_STRING, "",
                  "NAME://HOST:PORT of each listener (empty: one PLAINTEXT listener, oncelog serve --listen)."),
        ConfigKey("advertised.listeners", TYPE_STRING, "",
                  "NAME://HOST:PORT clients are told to connect to, per listener (default: the bound address)."),
        ConfigKey("listener.security.protocol.map", TYPE_STRING,
                  "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
                  "NAME:PROTOCOL for each listener name."),
        ConfigKey("inter.broker.listener.name", TYPE_STRING, "", "Listener other brokers connect to."),
        ConfigKey("security.inter.broker.protocol", TYPE_STRING, "",
                  "Protocol of the inter-broker listener, when inter.broker.listener.name is not set (PLAINTEXT)."),
        ConfigKey("sasl.mechanism.inter.broker.protocol", TYPE_STRING, "GSSAPI",
                  "SASL mechanism brokers authenticate to each other with."),
        ConfigKey("sasl.enabled.mechanisms", TYPE_LIST, ["GSSAPI"],
                  "SASL mechanisms a SASL listener offers (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)."),
        ConfigKey("sasl.server.max.receive.size", TYPE_INT, 524288,
                  "Largest SASL token a client may send before it is authenticated.", at_least(1)),
        ConfigKey("connections.max.reauth.ms", TYPE_LONG, 0,
                  "Session lifetime of a SASL connection before it must re-authenticate (KIP-368); 0: unbounded.",
                  at_least(0)),
        ConfigKey("connection.failed.authentication.delay.ms", TYPE_INT, 100,
                  "Delay before a failed authentication's answer and close, against password guessing.",
                  at_least(0)),
        ConfigKey("oncelog.authentication.timeout.ms", TYPE_INT, 30000,
                  "Time a new connection has to finish its TLS handshake and SASL authentication; it is closed "
                  "after that.", at_least(1)),
        ConfigKey("ssl.keystore.type", TYPE_STRING, "PEM", "Key store format (PEM).", one_of("PEM")),
        ConfigKey("ssl.keystore.location", TYPE_STRING, "",
                  "PEM file holding the private key (PKCS#8) followed by the certificate chain."),
        ConfigKey("ssl.keystore.password", TYPE_STRING, "", "Not used by PEM key stores.", sensitive=True),
        ConfigKey("ssl.keystore.certificate.chain", TYPE_STRING, "", "The certificate chain as PEM text.",
                  sensitive=True),
        ConfigKey("ssl.keystore.key", TYPE_STRING, "", "The private key as PEM text.", sensitive=True),
        ConfigKey("ssl.key.password", TYPE_STRING, "", "Password of an encrypted private key.", sensitive=True),
        ConfigKey("ssl.truststore.type", TYPE_STRING, "PEM", "Trust store format (PEM).", one_of("PEM")),
        ConfigKey("ssl.truststore.location", TYPE_STRING, "", "PEM file of the trusted CA certificates."),
        ConfigKey("ssl.truststore.password", TYPE_STRING, "", "Not used by PEM trust stores.", sensitive=True),
        ConfigKey("ssl.truststore.certificates", TYPE_STRING, "", "Trusted CA certificates as PEM text."),
        ConfigKey("ssl.client.auth", TYPE_STRING, "none", "Client certificates: none, requested or required.",
                  one_of("none", "requested", "required")),
        ConfigKey("ssl.principal.mapping.rules", TYPE_STRING, "DEFAULT",
                  "Rules mapping a certificate's distinguished name to a principal name."),
        ConfigKey("ssl.allow.dn.changes", TYPE_BOOLEAN, False,
                  "Whether a key store replaced at run time may change its certificate's distinguished name."),
        ConfigKey("ssl.allow.san.changes", TYPE_BOOLEAN, False,
                  "Whether a key store replaced at run time may drop subject alternative names of its certificate."),
        ConfigKey("ssl.enabled.protocols", TYPE_LIST, list(tls_versions), "TLS versions accepted.",
                  list_of(*tls_versions)),
        ConfigKey("ssl.protocol", TYPE_STRING, "TLSv1.3", "Highest TLS version offered.", one_of(*tls_versions)),
        ConfigKey("ssl.cipher.suites", TYPE_LIST, [], "TLS 1.2 cipher suites (OpenSSL names); empty: the default."),
        ConfigKey("ssl.endpoint.identification.algorithm", TYPE_STRING, "https",
                  "Host name checking of the certificate of a broker this broker connects to (https or empty)."),
        ConfigKey("sasl.oauthbearer.jwks.endpoint.url", TYPE_STRING, "",
                  "JWKS that signs OAUTHBEARER tokens: a file path, file:// or http(s):// URL."),
        ConfigKey("sasl.oauthbearer.jwks.endpoint.refresh.ms", TYPE_LONG, 3600000,
                  "How often the JWKS is read again.", at_least(1000)),
        ConfigKey("sasl.oauthbearer.expected.audience", TYPE_LIST, [],
                  "Audiences a token must name one of (empty: the aud claim is not checked)."),
        ConfigKey("sasl.oauthbearer.expected.issuer", TYPE_STRING, "",
                  "The iss claim a token must carry (empty: not checked)."),
        ConfigKey("sasl.oauthbearer.clock.skew.seconds", TYPE_INT, 30,
                  "Leeway for exp, nbf and iat against this broker's clock.", at_least(0)),
        ConfigKey("sasl.oauthbearer.sub.claim.name", TYPE_STRING, "sub", "Claim naming the principal."),
        ConfigKey("sasl.oauthbearer.scope.claim.name", TYPE_STRING, "scope", "Claim holding the token's scopes."),
        ConfigKey("authorizer.class.name", TYPE_STRING, "",
                  "org.apache.kafka.metadata.authorizer.StandardAuthorizer turns ACLs on; empty: off."),
        ConfigKey("super.users", TYPE_STRING, "", "Principals allowed everything, separated by ';'."),
        ConfigKey("allow.everyone.if.no.acl.found", TYPE_BOOLEAN, False,
                  "Allow an operation on a resource that no ACL matches."),
    ]


BROKER_KEYS = _broker_keys()

# Kafka keys the broker refuses at startup instead of taking them and doing nothing (issue 21): key -> why.
REFUSED_BROKER_KEYS: dict[str, str] = {
    "log.flush.start.offset.checkpoint.interval.ms":
        "log-start-offset-checkpoint is written every time a log start offset moves (DeleteRecords, retention, "
        "a follower taking its leader's), so there is no interval to set; remove the key",
}

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def topic_name_problem(name: str) -> str | None:
    """Kafka's topic name rules; None when the name is legal."""
    if name in (".", ".."):
        return "Topic name cannot be '.' or '..'"
    if not _TOPIC_NAME.match(name or ""):
        return "Topic name must be 1-249 characters of ASCII alphanumerics, '.', '_' and '-'"
    return None


@dataclass
class BrokerConfig:
    """Validated broker settings, plus where each value came from (for DescribeConfigs)."""

    values: dict[str, Any]
    explicit: set[str] = field(default_factory=set)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def retention_ms(self) -> int:
        if self.values["log.retention.ms"] is not None:
            return self.values["log.retention.ms"]
        if self.values["log.retention.minutes"] is not None:
            minutes = self.values["log.retention.minutes"]
            return -1 if minutes < 0 else minutes * 60000
        hours = self.values["log.retention.hours"]
        return -1 if hours < 0 else hours * 3600000

    @property
    def roll_ms(self) -> int:
        if self.values["log.roll.ms"] is not None:
            return self.values["log.roll.ms"]
        return self.values["log.roll.hours"] * 3600000

    def topic_default(self, key: str) -> Any:
        """The broker-level default of a topic key."""
        if key == "retention.ms":
            return self.retention_ms
        if key == "segment.ms":
            return self.roll_ms
        synonym = TOPIC_KEYS[key].broker_synonym
        if synonym in self.values:
            return self.values[synonym]
        return TOPIC_KEYS[key].default

    def topic_config(self, overrides: Mapping[str, Any] | None = None) -> TopicConfig:
        values = {key: self.topic_default(key) for key in TOPIC_KEYS}
        values.update(overrides or {})
        return TopicConfig(values, dict(overrides or {}))


@dataclass
class TopicConfig:
    """A topic's effective settings: broker defaults with the topic's overrides on top."""

    values: dict[str, Any]
    overrides: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def compacted(self) -> bool:
        return "compact" in self.values["cleanup.policy"]

    @property
    def deletes(self) -> bool:
        return "delete" in self.values["cleanup.policy"]

    @property
    def log_append_time(self) -> bool:
        return self.values["message.timestamp.type"] == "LogAppendTime"


def parse_topic_overrides(pairs: Mapping[str, Any]) -> dict[str, Any]:
    """Validate topic-level overrides (CreateTopics, AlterConfigs); raise ConfigError naming the key."""
    out: dict[str, Any] = {}
    for name, raw in pairs.items():
        key = TOPIC_KEYS.get(name)
        if key is None:
            raise ConfigError(f"Unknown topic config name: {name}")
        out[name] = key.parse(raw)
    return out


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java .properties syntax: '=' or ':' separators, '#'/'!' comments, '\\' continuations."""
    result: dict[str, str] = {}
    logical: list[str] = []
    for raw_line in text.splitlines():
        line = raw_line.lstrip() if not logical else raw_line.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            logical.append(line[:-1])
            continue
        logical.append(line)
        entry = "".join(logical)
        logical = []
        match = re.match(r"^((?:\\.|[^=:\s])+)\s*[=:\s]\s*(.*)$", entry)
        if match is None:
            key, value = entry.strip(), ""
        else:
            key, value = match.group(1), match.group(2)
        result[_unescape(key)] = _unescape(value.rstrip())
    if logical:
        entry = "".join(logical)
        key, _, value = entry.partition("=")
        result[_unescape(key.strip())] = _unescape(value.strip())
    return result


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(m.group(1), m.group(1)), text)


def load_broker_config(
    properties_text: str | None = None, overrides: Iterable[str] = (), strict: bool = True
) -> BrokerConfig:
    """Build the broker config from a properties file's text and `--set key=value` overrides."""
    raw: dict[str, str] = {}
    if properties_text:
        raw.update(parse_properties(properties_text))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        raw[key.strip()] = value
    values = {name: key.default for name, key in BROKER_KEYS.items()}
    explicit: set[str] = set()
    for name, value in raw.items():
        if name in REFUSED_BROKER_KEYS:
            raise ConfigError(f"Configuration {name} is not supported: {REFUSED_BROKER_KEYS[name]}")
        key = BROKER_KEYS.get(name)
        prefixed = split_listener_key(name)
        if key is None and prefixed is not None:
            base = prefixed[1]
            if not is_listener_key(base):
                raise ConfigError(f"Unknown configuration key: {name} ({base} cannot be set per listener)")
            if base in BROKER_KEYS:
                values[name] = BROKER_KEYS[base].parse(value)
            else:  # <mechanism>.sasl.jaas.config
                values[name] = str(value).strip()
            explicit.add(name)
            continue
        if key is None:
            alias = _ALIASES.get(name)
            if alias is None:
                if strict:
                    raise ConfigError(f"Unknown configuration key: {name}")
                continue
            key = BROKER_KEYS[alias]
        values[key.name] = key.parse(value)
        explicit.add(key.name)
    if (values["oncelog.coordination.connect"]
            and values["oncelog.controller.session.timeout.ms"] > values["oncelog.coordination.session.timeout.ms"]):
        raise ConfigError(
            f"Invalid value {str(values['oncelog.controller.session.timeout.ms'])!r} for configuration "
            "oncelog.controller.session.timeout.ms: must be at most oncelog.coordination.session.timeout.ms "
            f"({values['oncelog.coordination.session.timeout.ms']})")
    if values["max.connections.per.ip"] == 0 and not parse_ip_overrides(values["max.connections.per.ip.overrides"]):
        raise ConfigError("max.connections.per.ip can be set to zero only if max.connections.per.ip.overrides "
                          "property is set.")
    if values["listeners"]:
        try:
            inter_broker_listener(values, listener_specs(values))
        except ListenerError as exc:
            raise ConfigError(str(exc)) from None
    if not values["oncelog.coordination.connect"] and values["zookeeper.set.acl"]:
        raise ConfigError("zookeeper.set.acl=true needs a cluster's ZooKeeper: a single node keeps its metadata, "
                          "ACLs and credentials in its data directory (set oncelog.coordination.connect to run a "
                          "cluster)")
    if not values["oncelog.coordination.connect"] and values["default.replication.factor"] != 1:
        raise ConfigError("Invalid value for configuration default.replication.factor: must be 1 on a single "
                          "broker (set oncelog.coordination.connect to run a cluster)")
    return BrokerConfig(values, explicit)


# Kafka names that mean the same as one of ours.
_ALIASES = {"broker.id": "node.id"}
