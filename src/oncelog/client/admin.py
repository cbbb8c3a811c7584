"""Admin / AsyncAdmin: topics, configs, records, offsets, groups, producers and transactions.

Every answer's error code reaches the caller as the typed exception `errors.error_for`
builds (its `.code` is the wire number), with the item it concerns in the message;
retriable codes (a coordinator moving, a leader unknown, a connection lost) are retried
with backoff until `api_timeout` runs out, after a metadata refresh or coordinator
rediscovery. Methods that take many items raise for the first item that failed, after
the broker processed them all.

Requests go where Kafka's admin client sends them: topic and config changes to any
broker, per-partition operations (ListOffsets, DeleteRecords, DescribeProducers,
WriteTxnMarkers) to each partition's leader, group and transaction questions to their
coordinator, listings to every broker. The version of each request is the highest
both sides speak within the range whose shape this module builds.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey

from .admin_types import (
    CONFIG_SOURCES,
    EARLIEST,
    LATEST,
    MAX_TIMESTAMP,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    ClusterDescription,
    CommittedOffset,
    ConfigEntry,
    CreatedTopic,
    GroupDescription,
    GroupListing,
    HangingTransaction,
    ListedOffset,
    MemberDescription,
    OffsetReset,
    PartitionInfo,
    ProducerState,
    TopicDescription,
    TopicListing,
    TransactionDescription,
    TransactionListing,
    isolation_level,
    kafka_uuid,
    offset_spec,
)
from .cluster import Cluster
from .config import ClientConfig
from .errors import KafkaError, NetworkError, RetriableError, error_for
from .runtime import get_runtime
from .types import TopicPartition

__all__ = ["AsyncAdmin", "Admin", "find_hanging"]

T = TypeVar("T")
TP = tuple[str, int]

# The version ranges whose request shape this module builds (see the module docstring).
_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.METADATA: (10, 12),
    ApiKey.CREATE_TOPICS: (5, 7),
    ApiKey.DELETE_TOPICS: (6, 6),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.LIST_OFFSETS: (4, 9),
    ApiKey.DESCRIBE_GROUPS: (4, 5),
    ApiKey.LIST_GROUPS: (4, 4),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_FETCH: (8, 8),
    ApiKey.OFFSET_COMMIT: (7, 9),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.WRITE_TXN_MARKERS: (1, 1),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
}
_MAX_TIMESTAMP_SINCE = 7  # ListOffsets: the first version that knows MAX_TIMESTAMP (KIP-734)
_GROUP, _TRANSACTION = 0, 1  # FindCoordinator key types
_OP_SET, _OP_DELETE, _OP_APPEND, _OP_SUBTRACT = 0, 1, 2, 3
# Codes after which a coordinator must be looked up again.
_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
# Retriable on the wire, final for an admin: metadata was refreshed just before the answer.
_FINAL = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
_INACTIVE_GROUP_STATES = frozenset({"Empty", "Dead"})
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000  # kafka-transactions.sh find-hanging's default


def _tp(item: Any) -> TP:
    """A (topic, partition) from a TopicPartition or any 2-tuple."""
    if isinstance(item, TopicPartition):
        return item.topic, item.partition
    topic, partition = item
    return str(topic), int(partition)


def _key(tp: TP) -> TopicPartition:
    return TopicPartition(tp[0], tp[1])


def _fail(code: int, message: str | None, where: str, name: str | None = None) -> KafkaError:
    """The typed error for `code`, saying which item it concerns (unless the broker's message names it)."""
    error = error_for(code, message)
    assert error is not None
    if not (message and name and name in message):
        error.message = f"{where}: {error.message}"
        error.args = (error.message,)
    return error


def _check(code: int, message: str | None, where: str, name: str | None = None) -> None:
    if code:
        raise _fail(code, message, where, name)


def _by_topic(tps: Iterable[TP]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for topic, partition in tps:
        topics.setdefault(topic, []).append(partition)
    return topics


def decode_assignment(data: bytes | None) -> tuple[TP, ...]:
    """The partitions in a consumer-protocol member assignment (any version: they all start the same way)."""
    if not data:
        return ()
    view = memoryview(data)
    pos = 2  # int16 version
    (count,) = struct.unpack_from(">i", view, pos)
    pos += 4
    out: list[TP] = []
    for _ in range(max(count, 0)):
        (n,) = struct.unpack_from(">h", view, pos)
        topic = bytes(view[pos + 2:pos + 2 + n]).decode()
        pos += 2 + n
        (parts,) = struct.unpack_from(">i", view, pos)
        pos += 4
        for partition in struct.unpack_from(f">{max(parts, 0)}i", view, pos):
            out.append((topic, partition))
        pos += 4 * max(parts, 0)
    return tuple(sorted(out))


def find_hanging(
    open_txns: Iterable[tuple[TP, ProducerState]],
    txn_ids: Mapping[int, str],
    descriptions: Mapping[str, TransactionDescription | None],
    now_ms: int,
    max_transaction_timeout_ms: int,
) -> list[HangingTransaction]:
    """kafka-transactions.sh find-hanging's rule, as a pure function.

    A partition's open transaction is a candidate once its producer has been silent there for
    longer than the largest transaction timeout allowed (a live transaction would have been
    committed, aborted or timed out by then). A candidate hangs when no coordinator will ever
    write its marker: no transactional id maps to its producer id, or the id is unknown to
    its coordinator, or the coordinator's transaction does not include that partition.
    """
    hanging = []
    for (topic, partition), state in open_txns:
        if state.current_txn_start_offset is None:
            continue
        duration = now_ms - state.last_timestamp
        if duration <= max_transaction_timeout_ms:
            continue
        txn_id = txn_ids.get(state.producer_id)
        if txn_id is None:
            reason = "unknown producer id"
        elif descriptions.get(txn_id) is None:
            reason = "unknown transactional id"
        elif (topic, partition) not in descriptions[txn_id].partitions:  # type: ignore[union-attr]
            reason = "partition not in transaction"
        else:
            continue
        hanging.append(HangingTransaction(
            topic, partition, state.producer_id, state.producer_epoch, state.coordinator_epoch,
            state.current_txn_start_offset, state.last_timestamp, duration, reason,
        ))
    return sorted(hanging, key=lambda h: (h.topic, h.partition, h.start_offset))


class AsyncAdmin:
    """The asyncio admin client. `await start()` (or `async with`) before use, `await close()` after."""

    def __init__(self, config: Mapping[str, Any] | ClientConfig, *, api_timeout: float = 60.0) -> None:
        self.config = config if isinstance(config, ClientConfig) else ClientConfig(config, "admin")
        self.api_timeout = api_timeout
        self._request_timeout = self.config["request.timeout.ms"] / 1000
        self._backoff = self.config["retry.backoff.ms"] / 1000
        self._backoff_max = max(self.config["retry.backoff.max.ms"] / 1000, self._backoff)
        self._cluster = Cluster(self.config)

    async def start(self) -> AsyncAdmin:
        await self._cluster.bootstrap()
        return self

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> AsyncAdmin:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- plumbing -------------------------------------------------------------------------------------------------
    async def _call(self, conn: Any, api_key: int, build: Callable[[int], dict[str, Any]] | dict[str, Any]) -> Any:
        low, high = _VERSIONS[api_key]
        version = conn.api_version(api_key, high, low)
        data = build(version) if callable(build) else build
        return await conn.call(api_key, data, version=version, timeout=self._request_timeout)

    async def _retrying(self, attempt: Callable[[], Awaitable[T]],
                        recover: Callable[[KafkaError], Awaitable[None]] | None = None) -> T:
        """Run `attempt` until it does not raise a retriable error or the API timeout runs out."""
        deadline = time.monotonic() + self.api_timeout
        backoff = self._backoff
        while True:
            try:
                return await attempt()
            except RetriableError as exc:
                if exc.code in _FINAL or time.monotonic() + backoff > deadline:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_max)
                if recover is not None:
                    await recover(exc)

    async def _leaders(self, tps: Iterable[TP]) -> dict[int, list[TP]]:
        """Partitions grouped by leader; an unknown topic or partition raises UNKNOWN_TOPIC_OR_PARTITION."""
        tps = list(dict.fromkeys(tps))
        await self._cluster.refresh_metadata(sorted({t for t, _ in tps}), force=True)
        grouped: dict[int, list[TP]] = {}
        for topic, partition in tps:
            partitions = self._cluster.partitions_for(topic)
            if partitions is None or partition not in partitions:
                raise _fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, f"{topic}-{partition}")
            leader = self._cluster.leader_for(topic, partition)
            if leader is None or leader < 0:
                raise _fail(ErrorCode.LEADER_NOT_AVAILABLE, None, f"{topic}-{partition}")
            grouped.setdefault(leader, []).append((topic, partition))
        return grouped

    async def _per_leader(self, tps: Iterable[TP], send: Callable[[Any, list[TP]], Awaitable[dict[TP, T]]]
                          ) -> dict[TP, T]:
        """Send one request per leader (concurrently) and merge the per-partition answers."""
        async def attempt() -> dict[TP, T]:
            grouped = await self._leaders(tps)

            async def one(node: int, part: list[TP]) -> dict[TP, T]:
                return await send(await self._cluster.connection(node), part)

            merged: dict[TP, T] = {}
            for answer in await asyncio.gather(*(one(n, p) for n, p in grouped.items())):
                merged.update(answer)
            return merged

        return await self._retrying(attempt)

    async def _coordinated(self, key: str, key_type: int, send: Callable[[Any], Awaitable[T]]) -> T:
        """Send to the coordinator of `key`, finding it again when it moved."""
        async def attempt() -> T:
            return await send(await self._cluster.coordinator(key, key_type))

        async def recover(exc: KafkaError) -> None:
            if exc.code in _COORDINATOR_MOVED or isinstance(exc, NetworkError):
                self._cluster.invalidate_coordinator(key, key_type)

        return await self._retrying(attempt, recover)

    async def _any(self, api_key: int, build: Callable[[int], dict[str, Any]] | dict[str, Any]) -> Any:
        return await self._call(await self._cluster.any_connection(), api_key, build)

    async def _every_broker(self, send: Callable[[Any], Awaitable[T]]) -> list[T]:
        """Listings (groups, transactions) are per broker: ask each one the metadata names."""
        await self._retrying(lambda: self._cluster.refresh_metadata(force=True))
        conns = [await self._cluster.connection(node) for node in sorted(self._cluster.brokers)]
        return list(await asyncio.gather(*(send(conn) for conn in conns)))

    async def _metadata(self, topics: list[str] | None) -> Any:
        def build(version: int) -> dict[str, Any]:
            return {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
                    "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
        return await self._retrying(lambda: self._any(ApiKey.METADATA, build))

    # -- cluster ----------------------------------------------------------------------------------------------------
    async def describe_cluster(self) -> ClusterDescription:
        def build(version: int) -> dict[str, Any]:
            return {"include_cluster_authorized_operations": False, "endpoint_type": 1}

        resp = await self._retrying(lambda: self._any(ApiKey.DESCRIBE_CLUSTER, build))
        _check(resp.error_code, resp.error_message, "cluster")
        brokers = tuple(sorted((b.broker_id, b.host, b.port) for b in resp.brokers))
        return ClusterDescription(resp.cluster_id, resp.controller_id, brokers)

    # -- topics -----------------------------------------------------------------------------------------------------
    async def create_topic(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                           configs: Mapping[str, str] | None = None, *, validate_only: bool = False) -> CreatedTopic:
        """Create one topic (-1: the broker's default partitions / replication factor)."""
        data = {
            "topics": [{"name": name, "num_partitions": num_partitions, "replication_factor": replication_factor,
                        "assignments": [], "configs": [{"name": k, "value": None if v is None else str(v)}
                                                       for k, v in (configs or {}).items()]}],
            "timeout_ms": int(self.api_timeout * 1000), "validate_only": validate_only,
        }
        resp = await self._retrying(lambda: self._any(ApiKey.CREATE_TOPICS, data))
        (result,) = resp.topics
        _check(result.error_code, result.error_message, f"topic {name!r}", name)
        if not validate_only:
            await self._until_in_metadata(name, result.num_partitions)
        return CreatedTopic(
            result.name, kafka_uuid(getattr(result, "topic_id", None)), result.num_partitions,
            result.replication_factor, {c.name: c.value for c in result.configs or ()},
        )

    async def delete_topics(self, names: Iterable[str]) -> None:
        names = list(names)
        data = {"topics": [{"name": n, "topic_id": None} for n in names],
                "timeout_ms": int(self.api_timeout * 1000)}
        resp = await self._retrying(lambda: self._any(ApiKey.DELETE_TOPICS, data))
        for result in resp.responses:
            _check(result.error_code, result.error_message, f"topic {result.name!r}", result.name)

    async def delete_topic(self, name: str) -> None:
        await self.delete_topics([name])

    async def list_topics(self, *, include_internal: bool = False) -> list[TopicListing]:
        resp = await self._metadata(None)
        out = [TopicListing(t.name, kafka_uuid(t.topic_id), t.is_internal, len(t.partitions))
               for t in resp.topics if t.error_code == 0 and (include_internal or not t.is_internal)]
        return sorted(out, key=lambda t: t.name)

    async def describe_topics(self, names: Iterable[str], *, include_configs: bool = False
                              ) -> dict[str, TopicDescription]:
        names = list(dict.fromkeys(names))
        resp = await self._metadata(names)
        for t in resp.topics:
            _check(t.error_code, None, f"topic {t.name!r}")
        configs_of = (await self._describe_configs(self._cluster.any_connection, RESOURCE_TOPIC, names, None, False)
                      if include_configs and names else {})
        found = {}
        for t in resp.topics:
            partitions = tuple(
                PartitionInfo(p.partition_index, p.leader_id, p.leader_epoch, tuple(p.replica_nodes),
                              tuple(p.isr_nodes))
                for p in sorted(t.partitions, key=lambda p: p.partition_index)
            )
            found[t.name] = TopicDescription(t.name, kafka_uuid(t.topic_id), t.is_internal, partitions,
                                             configs_of.get(t.name) if include_configs else None)
        return {name: found[name] for name in names}

    async def describe_topic(self, name: str, *, include_configs: bool = False) -> TopicDescription:
        return (await self.describe_topics([name], include_configs=include_configs))[name]

    async def create_partitions(self, topic: str, total: int, *, validate_only: bool = False) -> None:
        """Grow `topic` to `total` partitions."""
        data = {"topics": [{"name": topic, "count": total, "assignments": None}],
                "timeout_ms": int(self.api_timeout * 1000), "validate_only": validate_only}
        resp = await self._retrying(lambda: self._any(ApiKey.CREATE_PARTITIONS, data))
        for result in resp.results:
            _check(result.error_code, result.error_message, f"topic {result.name!r}", result.name)
        if not validate_only:
            await self._until_in_metadata(topic, total)

    async def _until_in_metadata(self, topic: str, partitions: int) -> None:
        """Until the metadata shows `topic` with at least `partitions` partitions, each with a leader (at most the
        API timeout; the change itself already succeeded). Apache Kafka acknowledges CreateTopics and
        CreatePartitions once its controller has committed them, and a broker applies them to its metadata a
        moment later: until then it answers for the topic with UNKNOWN_TOPIC_OR_PARTITION, which this client takes
        as final, or with the old partition count. Waiting here lets a caller use what it created at once."""
        deadline = time.monotonic() + self.api_timeout
        backoff = self._backoff
        while True:
            try:
                await self._cluster.refresh_metadata([topic], force=True)
                known = self._cluster.partitions_for(topic) or []
                leaders = [self._cluster.leader_for(topic, p) for p in known]
                if known and len(known) >= partitions and all(x is not None and x >= 0 for x in leaders):
                    return
            except RetriableError:
                pass
            if time.monotonic() + backoff > deadline:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._backoff_max)

    # -- configs ----------------------------------------------------------------------------------------------------
    async def _describe_configs(self, conn_for: Callable[[], Awaitable[Any]], resource_type: int,
                                names: list[str], keys: Iterable[str] | None, synonyms: bool
                                ) -> dict[str, dict[str, ConfigEntry]]:
        """One DescribeConfigs for several resources of one type; the first failed resource raises."""
        wanted = None if keys is None else list(keys)
        data = {"resources": [{"resource_type": resource_type, "resource_name": name, "configuration_keys": wanted}
                              for name in names],
                "include_synonyms": synonyms, "include_documentation": False}

        async def attempt() -> Any:
            return await self._call(await conn_for(), ApiKey.DESCRIBE_CONFIGS, data)

        resp = await self._retrying(attempt)
        out = {}
        for result in resp.results:
            name = result.resource_name
            what = f"topic {name!r}" if resource_type == RESOURCE_TOPIC else f"broker {name}"
            _check(result.error_code, result.error_message, what, name)
            out[name] = {
                c.name: ConfigEntry(
                    c.name, c.value, CONFIG_SOURCES.get(c.config_source, "UNKNOWN"), c.read_only, c.is_sensitive,
                    tuple((s.name, s.value, CONFIG_SOURCES.get(s.source, "UNKNOWN")) for s in c.synonyms or ()),
                )
                for c in sorted(result.configs, key=lambda c: c.name)
            }
        return out

    async def describe_topic_configs(self, topic: str, keys: Iterable[str] | None = None, *,
                                     synonyms: bool = False) -> dict[str, ConfigEntry]:
        found = await self._describe_configs(self._cluster.any_connection, RESOURCE_TOPIC, [topic], keys, synonyms)
        return found[topic]

    async def describe_broker_configs(self, broker_id: int | None = None, keys: Iterable[str] | None = None, *,
                                      synonyms: bool = False) -> dict[str, ConfigEntry]:
        if broker_id is None:
            broker_id = (await self.describe_cluster()).brokers[0][0]
        node = broker_id
        found = await self._describe_configs(lambda: self._cluster.connection(node), RESOURCE_BROKER, [str(node)],
                                             keys, synonyms)
        return found[str(node)]

    async def alter_topic_configs(self, topic: str, set: Mapping[str, str] | None = None,  # noqa: A002
                                  delete: Iterable[str] = (), append: Mapping[str, str] | None = None,
                                  subtract: Mapping[str, str] | None = None, *, validate_only: bool = False) -> None:
        """IncrementalAlterConfigs: set, delete (back to the default), append to / subtract from list configs."""
        ops = [{"name": k, "config_operation": _OP_SET, "value": str(v)} for k, v in (set or {}).items()]
        ops += [{"name": k, "config_operation": _OP_DELETE, "value": None} for k in delete]
        ops += [{"name": k, "config_operation": _OP_APPEND, "value": str(v)} for k, v in (append or {}).items()]
        ops += [{"name": k, "config_operation": _OP_SUBTRACT, "value": str(v)} for k, v in (subtract or {}).items()]
        data = {"resources": [{"resource_type": RESOURCE_TOPIC, "resource_name": topic, "configs": ops}],
                "validate_only": validate_only}
        resp = await self._retrying(lambda: self._any(ApiKey.INCREMENTAL_ALTER_CONFIGS, data))
        for result in resp.responses:
            _check(result.error_code, result.error_message, f"topic {result.resource_name!r}", result.resource_name)

    # -- records and offsets ------------------------------------------------------------------------------------------
    async def delete_records(self, before: Mapping[Any, int]) -> dict[TopicPartition, int]:
        """Move each partition's log start offset to the given offset (-1: the high watermark).

        Returns the new low watermark of each partition."""
        targets = {_tp(k): int(v) for k, v in before.items()}

        async def send(conn: Any, tps: list[TP]) -> dict[TP, int]:
            data = {"topics": [{"name": t, "partitions": [{"partition_index": p, "offset": targets[(t, p)]}
                                                          for p in ps]} for t, ps in _by_topic(tps).items()],
                    "timeout_ms": int(self._request_timeout * 1000)}
            resp = await self._call(conn, ApiKey.DELETE_RECORDS, data)
            out = {}
            for t in resp.topics:
                for p in t.partitions:
                    _check(p.error_code, None, f"{t.name}-{p.partition_index}")
                    out[(t.name, p.partition_index)] = p.low_watermark
            return out

        answer = await self._per_leader(targets, send)
        return {_key(tp): answer[tp] for tp in targets}

    async def list_offsets(self, specs: Mapping[Any, str | int], *,
                           isolation: str | int = "read_uncommitted") -> dict[TopicPartition, ListedOffset]:
        """Offsets by spec per partition: 'earliest', 'latest' (the high watermark, or the last stable offset
        under read_committed), 'max_timestamp' (the record with the largest timestamp), or a timestamp in ms
        (the first record at or after it; offset -1 when there is none)."""
        wanted = {_tp(k): offset_spec(v) for k, v in specs.items()}
        level = isolation_level(isolation)

        async def send(conn: Any, tps: list[TP]) -> dict[TP, ListedOffset]:
            def build(version: int) -> dict[str, Any]:
                if version < _MAX_TIMESTAMP_SINCE and any(wanted[tp] == MAX_TIMESTAMP for tp in tps):
                    raise _fail(ErrorCode.UNSUPPORTED_VERSION, "the broker does not support max_timestamp",
                                "list offsets")
                return {"replica_id": -1, "isolation_level": level, "timeout_ms": int(self._request_timeout * 1000),
                        "topics": [{"name": t, "partitions": [
                            {"partition_index": p, "current_leader_epoch": -1, "timestamp": wanted[(t, p)]}
                            for p in ps]} for t, ps in _by_topic(tps).items()]}

            resp = await self._call(conn, ApiKey.LIST_OFFSETS, build)
            out = {}
            for t in resp.topics:
                for p in t.partitions:
                    _check(p.error_code, None, f"{t.name}-{p.partition_index}")
                    out[(t.name, p.partition_index)] = ListedOffset(p.offset, p.timestamp, p.leader_epoch)
            return out

        answer = await self._per_leader(wanted, send)
        return {_key(tp): answer[tp] for tp in wanted}

    async def topic_partitions(self, topic: str) -> list[TopicPartition]:
        description = await self.describe_topic(topic)
        return [TopicPartition(topic, p.partition) for p in description.partitions]

    # -- groups -------------------------------------------------------------------------------------------------------
    async def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        states = list(states)

        async def send(conn: Any) -> list[GroupListing]:
            async def attempt() -> Any:
                return await self._call(conn, ApiKey.LIST_GROUPS, {"states_filter": states})

            resp = await self._retrying(attempt)
            _check(resp.error_code, None, f"broker {conn.node_id}")
            return [GroupListing(g.group_id, g.group_state, g.protocol_type) for g in resp.groups]

        listed = [g for answer in await self._every_broker(send) for g in answer]
        return sorted(listed, key=lambda g: g.group_id)

    async def describe_group(self, group_id: str) -> GroupDescription:
        async def send(conn: Any) -> GroupDescription:
            resp = await self._call(conn, ApiKey.DESCRIBE_GROUPS,
                                    {"groups": [group_id], "include_authorized_operations": False})
            (g,) = resp.groups
            _check(g.error_code, getattr(g, "error_message", None), f"group {group_id!r}")
            consumer = g.protocol_type == "consumer"
            members = tuple(
                MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                  decode_assignment(m.member_assignment) if consumer else ())
                for m in g.members
            )
            return GroupDescription(g.group_id, g.group_state, g.protocol_type, g.protocol_data, conn.node_id,
                                    members)

        return await self._coordinated(group_id, _GROUP, send)

    async def delete_groups(self, group_ids: Iterable[str]) -> None:
        for group_id in dict.fromkeys(group_ids):
            async def send(conn: Any, group_id: str = group_id) -> None:
                resp = await self._call(conn, ApiKey.DELETE_GROUPS, {"groups_names": [group_id]})
                for r in resp.results:
                    _check(r.error_code, None, f"group {r.group_id!r}")

            await self._coordinated(group_id, _GROUP, send)

    async def delete_group(self, group_id: str) -> None:
        await self.delete_groups([group_id])

    async def list_group_offsets(self, group_id: str, partitions: Iterable[Any] | None = None
                                 ) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets: of every partition it has one for, or of the given partitions
        (offset -1 where it has none)."""
        tps = None if partitions is None else [_tp(x) for x in partitions]

        async def send(conn: Any) -> dict[TopicPartition, CommittedOffset]:
            topics = None if tps is None else [{"name": t, "partition_indexes": ps}
                                               for t, ps in _by_topic(tps).items()]
            resp = await self._call(conn, ApiKey.OFFSET_FETCH, {
                "groups": [{"group_id": group_id, "topics": topics}], "require_stable": False})
            (g,) = resp.groups
            _check(g.error_code, None, f"group {group_id!r}")
            out = {}
            for t in g.topics:
                for p in t.partitions:
                    _check(p.error_code, None, f"group {group_id!r} {t.name}-{p.partition_index}")
                    out[TopicPartition(t.name, p.partition_index)] = CommittedOffset(
                        p.committed_offset, p.committed_leader_epoch, p.metadata)
            return dict(sorted(out.items()))

        return await self._coordinated(group_id, _GROUP, send)

    async def alter_group_offsets(self, group_id: str, offsets: Mapping[Any, int]) -> None:
        """Commit offsets for a group as an admin (generation -1, no member): the group must be empty."""
        commits = {_tp(k): int(v) for k, v in offsets.items()}

        async def send(conn: Any) -> None:
            resp = await self._call(conn, ApiKey.OFFSET_COMMIT, {
                "group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "",
                "group_instance_id": None,
                "topics": [{"name": t, "partitions": [
                    {"partition_index": p, "committed_offset": commits[(t, p)], "committed_leader_epoch": -1,
                     "committed_metadata": ""} for p in ps]} for t, ps in _by_topic(commits).items()],
            })
            for t in resp.topics:
                for p in t.partitions:
                    _check(p.error_code, None, f"group {group_id!r} {t.name}-{p.partition_index}")

        await self._coordinated(group_id, _GROUP, send)

    async def plan_group_offset_reset(self, group_id: str, partitions: Iterable[Any], *, to: str,
                                      value: int | None = None) -> list[OffsetReset]:
        """Where `reset_group_offsets` would move each partition, as kafka-consumer-groups.sh computes it:
        to 'earliest' / 'latest', to an 'offset', or 'shift' the committed offset by `value`; targets are
        clamped to the partition's [log start, high watermark]. The group must be inactive."""
        tps = sorted(dict.fromkeys(_tp(x) for x in partitions))
        if to not in ("earliest", "latest", "offset", "shift"):
            raise ValueError(f"reset target must be earliest, latest, offset or shift, not {to!r}")
        if to in ("offset", "shift") and value is None:
            raise ValueError(f"reset to {to!r} needs a value")
        group = await self.describe_group(group_id)
        if group.state not in _INACTIVE_GROUP_STATES:
            raise _fail(ErrorCode.NON_EMPTY_GROUP,
                        f"offsets can only be reset while the group is inactive; it is {group.state}",
                        f"group {group_id!r}")
        earliest = await self.list_offsets({tp: EARLIEST for tp in tps})
        latest = await self.list_offsets({tp: LATEST for tp in tps})
        committed = await self.list_group_offsets(group_id, tps)
        plan = []
        for tp in tps:
            key = _key(tp)
            low, high = earliest[key].offset, latest[key].offset
            current = committed[key].offset if key in committed and committed[key].offset >= 0 else None
            if to == "earliest":
                target = low
            elif to == "latest":
                target = high
            elif to == "offset":
                target = int(value)  # type: ignore[arg-type]
            else:
                if current is None:
                    raise _fail(ErrorCode.OFFSET_NOT_AVAILABLE, "the group has no committed offset to shift",
                                f"group {group_id!r} {tp[0]}-{tp[1]}")
                target = current + int(value)  # type: ignore[arg-type]
            plan.append(OffsetReset(tp[0], tp[1], current, min(max(target, low), high)))
        return plan

    # -- producers and transactions (KIP-664) ---------------------------------------------------------------------------
    async def describe_producers(self, partitions: Iterable[Any]) -> dict[TopicPartition, list[ProducerState]]:
        """The active producers of each partition, from its leader's producer state."""
        tps = [_tp(x) for x in partitions]

        async def send(conn: Any, part: list[TP]) -> dict[TP, list[ProducerState]]:
            resp = await self._call(conn, ApiKey.DESCRIBE_PRODUCERS, {
                "topics": [{"name": t, "partition_indexes": ps} for t, ps in _by_topic(part).items()]})
            out = {}
            for t in resp.topics:
                for p in t.partitions:
                    _check(p.error_code, p.error_message, f"{t.name}-{p.partition_index}")
                    out[(t.name, p.partition_index)] = sorted(
                        (ProducerState(s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp,
                                       s.coordinator_epoch,
                                       None if s.current_txn_start_offset < 0 else s.current_txn_start_offset)
                         for s in p.active_producers),
                        key=lambda s: s.producer_id,
                    )
            return out

        answer = await self._per_leader(tps, send)
        return {_key(tp): answer[tp] for tp in dict.fromkeys(tps)}

    async def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                                min_duration_ms: int | None = None) -> list[TransactionListing]:
        """Transactional ids known to the coordinators, filtered by state (Kafka's names: Ongoing,
        CompleteCommit, ...), producer id, or how long the ongoing transaction has run."""
        states, producer_ids = list(states), list(producer_ids)
        low = 1 if min_duration_ms is not None else 0

        async def send(conn: Any) -> list[TransactionListing]:
            async def attempt() -> Any:
                version = conn.api_version(ApiKey.LIST_TRANSACTIONS, _VERSIONS[ApiKey.LIST_TRANSACTIONS][1], low)
                return await conn.call(ApiKey.LIST_TRANSACTIONS, {
                    "state_filters": states, "producer_id_filters": producer_ids,
                    "duration_filter": -1 if min_duration_ms is None else min_duration_ms,
                }, version=version, timeout=self._request_timeout)

            resp = await self._retrying(attempt)
            _check(resp.error_code, None, f"broker {conn.node_id}")
            if resp.unknown_state_filters:
                raise KafkaError(f"unknown transaction states: {', '.join(resp.unknown_state_filters)}")
            return [TransactionListing(t.transactional_id, t.producer_id, t.transaction_state)
                    for t in resp.transaction_states]

        listed = [t for answer in await self._every_broker(send) for t in answer]
        return sorted(listed, key=lambda t: t.transactional_id)

    async def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        async def send(conn: Any) -> TransactionDescription:
            resp = await self._call(conn, ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [transactional_id]})
            (s,) = resp.transaction_states
            _check(s.error_code, None, f"transactional id {transactional_id!r}")
            partitions = tuple(sorted((t.topic, p) for t in s.topics for p in t.partitions))
            return TransactionDescription(
                s.transactional_id, conn.node_id, s.transaction_state, s.producer_id, s.producer_epoch,
                s.transaction_timeout_ms, None if s.transaction_start_time_ms < 0 else s.transaction_start_time_ms,
                partitions,
            )

        return await self._coordinated(transactional_id, _TRANSACTION, send)

    async def find_hanging_transactions(self, topic: str | None = None, partition: int | None = None, *,
                                        max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
                                        ) -> list[HangingTransaction]:
        """Open transactions that no coordinator will finish (see `find_hanging`), on one partition, one
        topic, or every non-internal topic."""
        if partition is not None and topic is None:
            raise ValueError("a partition needs its topic")
        if topic is not None and partition is not None:
            tps: list[TP] = [(topic, partition)]
        else:
            names = [topic] if topic is not None else [t.name for t in await self.list_topics()]
            described = await self.describe_topics(names) if names else {}
            tps = [(d.name, p.partition) for d in described.values() for p in d.partitions]
        if not tps:
            return []
        producers = await self.describe_producers(tps)
        now = int(time.time() * 1000)
        candidates = [((k.topic, k.partition), s) for k, states in producers.items() for s in states
                      if s.current_txn_start_offset is not None
                      and now - s.last_timestamp > max_transaction_timeout_ms]
        if not candidates:
            return []
        pids = sorted({s.producer_id for _, s in candidates})
        txn_ids = {t.producer_id: t.transactional_id
                   for t in await self.list_transactions(producer_ids=pids) if t.producer_id in pids}
        descriptions: dict[str, TransactionDescription | None] = {}
        for txn_id in sorted(set(txn_ids.values())):
            try:
                descriptions[txn_id] = await self.describe_transaction(txn_id)
            except KafkaError as exc:
                if exc.code != ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                    raise
                descriptions[txn_id] = None
        return find_hanging(candidates, txn_ids, descriptions, now, max_transaction_timeout_ms)

    async def abort_transaction(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                                coordinator_epoch: int) -> None:
        """Write an abort marker for the producer's open transaction on one partition (WriteTxnMarkers to its
        leader, as Kafka's Admin.abortTransaction does). Meant for hanging transactions only: a live
        producer's transaction aborted this way loses its data on that partition."""
        # A producer id that started its transaction before any marker has coordinator epoch -1 in
        # DescribeProducers; 0 is at most any real coordinator epoch (kafka-transactions.sh does the same).
        coordinator_epoch = max(coordinator_epoch, 0)

        async def send(conn: Any, tps: list[TP]) -> dict[TP, None]:
            resp = await self._call(conn, ApiKey.WRITE_TXN_MARKERS, {"markers": [{
                "producer_id": producer_id, "producer_epoch": producer_epoch, "transaction_result": False,
                "topics": [{"name": topic, "partition_indexes": [partition]}],
                "coordinator_epoch": coordinator_epoch}]})
            out = {}
            for marker in resp.markers:
                for t in marker.topics:
                    for p in t.partitions:
                        _check(p.error_code, None, f"{t.name}-{p.partition_index} producer {producer_id}")
                        out[(t.name, p.partition_index)] = None
            return out

        await self._per_leader([(topic, partition)], send)

    async def abort_transaction_at(self, topic: str, partition: int, start_offset: int) -> ProducerState:
        """Abort the open transaction that starts at `start_offset` on the partition; returns its producer."""
        states = (await self.describe_producers([(topic, partition)]))[TopicPartition(topic, partition)]
        match = next((s for s in states if s.current_txn_start_offset == start_offset), None)
        if match is None:
            raise KafkaError(f"no open transaction starts at offset {start_offset} on {topic}-{partition}")
        await self.abort_transaction(topic, partition, match.producer_id, match.producer_epoch,
                                     match.coordinator_epoch)
        return match


class Admin:
    """The synchronous admin client: AsyncAdmin's methods, run on the shared client event-loop thread."""

    def __init__(self, config: Mapping[str, Any] | ClientConfig, *, api_timeout: float = 60.0) -> None:
        self._runtime = get_runtime()
        self._core = AsyncAdmin(config, api_timeout=api_timeout)
        self._runtime.run(self._core.start())
        self._closed = False

    @property
    def config(self) -> ClientConfig:
        return self._core.config

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._runtime.run(self._core.close())

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sync(name: str) -> Callable[..., Any]:
    method = getattr(AsyncAdmin, name)

    @functools.wraps(method)
    def call(self: Admin, *args: Any, **kwargs: Any) -> Any:
        return self._runtime.run(getattr(self._core, name)(*args, **kwargs))

    return call


_SYNC_METHODS = [
    "describe_cluster", "create_topic", "delete_topics", "delete_topic", "list_topics", "describe_topics",
    "describe_topic", "create_partitions", "describe_topic_configs", "describe_broker_configs",
    "alter_topic_configs", "delete_records", "list_offsets", "topic_partitions", "list_groups", "describe_group",
    "delete_groups", "delete_group", "list_group_offsets", "alter_group_offsets", "plan_group_offset_reset",
    "describe_producers", "list_transactions", "describe_transaction", "find_hanging_transactions",
    "abort_transaction", "abort_transaction_at",
]
for _name in _SYNC_METHODS:
    setattr(Admin, _name, _sync(_name))
