"""What the client knows about the cluster: brokers, topic metadata, leaders, coordinators, connections.

One `Cluster` per client instance, living on the runtime's event loop. It keeps one
connection per broker node id (DESIGN §6: the broker is single-node today, the code
is not), reconnects with exponential backoff (reconnect.backoff.ms up to
reconnect.backoff.max.ms, ±20 % jitter so that many clients restarting together do
not reconnect in lockstep), refreshes metadata on demand and every
metadata.max.age.ms, and finds coordinators with FindCoordinator.

Concurrent callers asking for the same thing share one attempt: ten partitions
whose leader is node 0 cause one connect, and a burst of unknown topics causes one
Metadata request at a time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey
from oncelog.protocol.messages import REQUESTS

from .config import ClientConfig
from .connection import BrokerConnection
from .errors import (
    AuthenticationError,
    KafkaError,
    KafkaTimeoutError,
    NetworkError,
    RetriableError,
    error_for,
)
from .security import security_from_config

__all__ = ["Cluster", "BrokerInfo", "TopicMetadata", "PartitionMetadata", "GROUP", "TRANSACTION", "COORDINATOR_BASE"]

log = logging.getLogger("oncelog.client.cluster")

GROUP = 0
TRANSACTION = 1

#: Coordinator traffic gets its own connection per broker, numbered COORDINATOR_BASE - node id (the Java
#: client's convention): a JoinGroup that waits out a rebalance, or an EndTxn, must not queue behind fetch
#: long polls on the data connection, nor hold them up.
COORDINATOR_BASE = 2**31 - 1

_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
_COORDINATOR_RETRY = _COORDINATOR_MOVED | {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}


class BrokerInfo(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None = None


class PartitionMetadata(NamedTuple):
    partition: int
    leader: int  # -1: no leader right now
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    error_code: int


class TopicMetadata(NamedTuple):
    name: str
    error_code: int
    partitions: dict[int, PartitionMetadata]
    is_internal: bool = False
    topic_id: Any = None


class _Backoff:
    """Exponential reconnect delay of one node."""

    __slots__ = ("failures", "not_before")

    def __init__(self) -> None:
        self.failures = 0
        self.not_before = 0.0


class Cluster:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicMetadata] = {}
        self.cluster_id: str | None = None
        self.controller_id: int = -1
        #: counters of what this cluster object did, for tests and metrics
        self.stats = {"metadata_requests": 0, "find_coordinator_requests": 0, "connects": 0, "connect_failures": 0,
                      "coordinator_moved": 0}
        self._bootstrap = [BrokerInfo(-1 - i, host, port) for i, (host, port) in enumerate(config.bootstrap_servers)]
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Task] = {}
        self._backoff: dict[int, _Backoff] = {}
        self._coordinators: dict[tuple[int, str], int] = {}
        self._finding: dict[tuple[int, str], asyncio.Task] = {}
        self._tracked: set[str] = set()
        self._metadata_at = 0.0  # monotonic time of the last successful refresh of the tracked topics
        self._refresh: asyncio.Task | None = None
        self._refresh_covers: frozenset[str] = frozenset()
        self._refresh_started = 0.0
        self._periodic: asyncio.Task | None = None
        # Called on the loop after every metadata answer is applied: a producer picks up partitions added later.
        self.metadata_listeners: list[Callable[[], None]] = []
        self._closed = False
        self._rotation = 0
        # TLS context and SASL credentials, built once: a bad file or key is a ValueError here, not later.
        self.security = security_from_config(config)
        #: the first authentication failure; every later connection attempt raises it at once (a wrong
        #: password or an untrusted certificate does not fix itself, and retrying would only hide it)
        self.auth_error: AuthenticationError | None = None

    # -- settings -------------------------------------------------------------------------------

    @property
    def request_timeout(self) -> float:
        return self.config["request.timeout.ms"] / 1000

    def _retry_delay(self, attempt: int) -> float:
        base = self.config["retry.backoff.ms"] / 1000
        cap = self.config["retry.backoff.max.ms"] / 1000
        return min(cap, base * (2 ** min(attempt, 20))) * random.uniform(0.8, 1.2)

    def _reconnect_delay(self, failures: int) -> float:
        base = self.config["reconnect.backoff.ms"] / 1000
        cap = self.config["reconnect.backoff.max.ms"] / 1000
        return min(cap, base * (2 ** min(failures - 1, 20))) * random.uniform(0.8, 1.2)

    # -- lifecycle ------------------------------------------------------------------------------

    async def bootstrap(self) -> None:
        """First metadata (brokers only, plus topics already asked for); starts the periodic refresh."""
        self._check_open()
        await self.refresh_metadata(force=True)
        if self._periodic is None:
            self._periodic = asyncio.get_running_loop().create_task(self._refresh_periodically())

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._periodic, self._refresh, *self._connecting.values(), *self._finding.values())
                 if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except BaseException:  # noqa: S110 - they were cancelled on purpose; their errors are moot
                pass
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaError("the client is closed")

    async def _refresh_periodically(self) -> None:
        interval = self.config["metadata.max.age.ms"] / 1000
        while not self._closed:
            await asyncio.sleep(max(0.05, self._metadata_at + interval - time.monotonic()))
            if time.monotonic() - self._metadata_at < interval:
                continue
            try:
                await self.refresh_metadata(force=True)
            except Exception as exc:  # a background task: log and try again later, never die
                log.info("periodic metadata refresh failed: %s", exc)
                self._metadata_at = time.monotonic() - interval + self._retry_delay(3)

    # -- connections ----------------------------------------------------------------------------

    @staticmethod
    def _is_coordinator_link(node_id: int) -> bool:
        return node_id > COORDINATOR_BASE // 2

    def _address(self, node_id: int) -> BrokerInfo | None:
        if self._is_coordinator_link(node_id):
            node_id = COORDINATOR_BASE - node_id
        info = self.brokers.get(node_id)
        if info is None:
            info = next((b for b in self._bootstrap if b.node_id == node_id), None)
        return info

    async def connection(self, node_id: int) -> BrokerConnection:
        """A connected connection to `node_id`, connecting if needed (after the node's reconnect backoff).

        Raises NetworkError when the attempt fails; the next call waits out the (longer) backoff.
        """
        self._check_open()
        conn = self._connections.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        if self.auth_error is not None:
            raise self.auth_error
        task = self._connecting.get(node_id)
        if task is None:
            if self._address(node_id) is None:
                await self.refresh_metadata(force=True)
                if self._address(node_id) is None:
                    raise RetriableError(f"broker node {node_id} is not in the cluster metadata",
                                         ErrorCode.BROKER_NOT_AVAILABLE)
            task = asyncio.get_running_loop().create_task(self._connect(node_id))
            self._connecting[node_id] = task
            task.add_done_callback(lambda t, n=node_id: self._connect_done(n, t))
        return await asyncio.shield(task)

    def _connect_done(self, node_id: int, task: asyncio.Task) -> None:
        if self._connecting.get(node_id) is task:
            del self._connecting[node_id]
        if not task.cancelled():
            task.exception()  # retrieved here: a caller that went away must not cause a warning

    async def _connect(self, node_id: int) -> BrokerConnection:
        backoff = self._backoff.setdefault(node_id, _Backoff())
        wait = backoff.not_before - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        info = self._address(node_id)
        if info is None:
            raise RetriableError(f"broker node {node_id} left the cluster metadata", ErrorCode.BROKER_NOT_AVAILABLE)
        conn = BrokerConnection(
            info.host, info.port, info.node_id,  # a coordinator link reports its broker's id
            client_id=self.config.client_id,
            request_timeout_ms=self.config["request.timeout.ms"],
            connect_timeout_ms=self.config["socket.connection.setup.timeout.ms"],
            security=self.security,
        )
        self.stats["connects"] += 1
        try:
            await conn.connect()
        except AuthenticationError as exc:
            self.stats["connect_failures"] += 1
            if self.auth_error is None:
                self.auth_error = exc
                log.error("authentication with %s failed: %s", conn.address, exc)
            raise
        except KafkaError:
            self.stats["connect_failures"] += 1
            backoff.failures += 1
            backoff.not_before = time.monotonic() + self._reconnect_delay(backoff.failures)
            raise
        if self._closed:
            await conn.close()
            raise KafkaError("the client is closed")
        backoff.failures = 0
        backoff.not_before = 0.0
        self._connections[node_id] = conn
        return conn

    def connected_nodes(self) -> list[int]:
        """Node ids with an open data connection (coordinator connections not included)."""
        return sorted(n for n, c in self._connections.items() if not c.closed and not self._is_coordinator_link(n))

    async def any_connection(self) -> BrokerConnection:
        """A connection to some broker: an open one if there is one, else the next reachable known broker,
        else a bootstrap server. NetworkError if none can be reached right now."""
        self._check_open()
        open_known = [c for n, c in self._connections.items() if not c.closed and n in self.brokers]
        if open_known:
            return min(open_known, key=lambda c: c.in_flight)
        open_any = [c for n, c in self._connections.items() if not c.closed and not self._is_coordinator_link(n)]
        if open_any:
            return open_any[0]
        candidates = list(self.brokers) or [b.node_id for b in self._bootstrap]
        self._rotation += 1
        start = self._rotation % len(candidates)
        candidates = candidates[start:] + candidates[:start]
        if self.brokers:  # the bootstrap list is the last resort when every known broker is unreachable
            candidates += [b.node_id for b in self._bootstrap]
        # Start with the node whose backoff ends first, so one dead broker does not stall the others.
        candidates.sort(key=lambda n: self._backoff[n].not_before if n in self._backoff else 0.0)
        last: KafkaError | None = None
        for node_id in candidates:
            try:
                return await self.connection(node_id)
            except NetworkError as exc:
                last = exc
        raise last or NetworkError("no broker address to connect to")

    # -- metadata -------------------------------------------------------------------------------

    async def refresh_metadata(self, topics: Iterable[str] | None = None, *, force: bool = False) -> None:
        """Make the metadata of `topics` (and of every topic asked for before) current.

        Without `force` nothing is sent when every topic is known and the metadata is younger
        than metadata.max.age.ms. Topics are created on the broker if allow.auto.create.topics
        (the producer's default). Errors per topic stay in `topics[name].error_code`.
        """
        self._check_open()
        wanted = set(topics) if topics is not None else set()
        self._tracked |= wanted
        max_age = self.config["metadata.max.age.ms"] / 1000
        started = time.monotonic()
        while True:
            fresh = time.monotonic() - self._metadata_at < max_age
            if not force and fresh and all(t in self.topics for t in wanted):
                return
            task = self._refresh
            if task is not None and not task.done():
                covers, began = self._refresh_covers, self._refresh_started
                await asyncio.shield(task)
                if wanted <= covers and (began >= started or not force):
                    return
                continue  # it did not cover what we need, or was sent before we asked: one more round
            self._refresh_covers = frozenset(self._tracked)
            self._refresh_started = time.monotonic()
            task = asyncio.get_running_loop().create_task(self._fetch_metadata(sorted(self._tracked)))
            self._refresh = task
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            await asyncio.shield(task)
            return

    async def _fetch_metadata(self, topics: list[str]) -> None:
        deadline = time.monotonic() + self.request_timeout
        attempt = 0
        while True:
            try:
                conn = await self.any_connection()
                response = await self._metadata_request(conn, topics)
                self._apply_metadata(response)
                return
            except NetworkError as exc:
                attempt += 1
                if time.monotonic() + self._retry_delay(attempt) >= deadline:
                    raise
                log.debug("metadata request failed (%s), retrying", exc)
                await asyncio.sleep(self._retry_delay(attempt))

    async def _metadata_request(self, conn: BrokerConnection, topics: list[str] | None) -> Any:
        cls = REQUESTS[ApiKey.METADATA]
        version = conn.api_version(ApiKey.METADATA, cls.max_version, 1)
        data: dict[str, Any] = {"topics": None if topics is None else [{"name": t} for t in topics]}
        if version >= 4:
            data["allow_auto_topic_creation"] = bool(self.config["allow.auto.create.topics"])
        self.stats["metadata_requests"] += 1
        return await conn.call(ApiKey.METADATA, data, version=version)

    def _apply_metadata(self, response: Any) -> None:
        brokers = {b.node_id: BrokerInfo(b.node_id, b.host, b.port, getattr(b, "rack", None))
                   for b in response.brokers}
        if brokers:
            for node_id, conn in list(self._connections.items()):
                if node_id < 0 or self._is_coordinator_link(node_id):
                    continue
                info = brokers.get(node_id)
                if info is None or (info.host, info.port) != (conn.host, conn.port):
                    self._drop_connection(node_id)  # the node moved or left: its connection is stale
            self.brokers = brokers
            self._adopt_bootstrap_connections()
        self.cluster_id = getattr(response, "cluster_id", None)
        self.controller_id = getattr(response, "controller_id", -1)
        for t in response.topics:
            partitions = {
                p.partition_index: PartitionMetadata(
                    p.partition_index, p.leader_id, getattr(p, "leader_epoch", -1),
                    list(p.replica_nodes or ()), list(p.isr_nodes or ()), p.error_code)
                for p in (t.partitions or ())
            }
            self.topics[t.name] = TopicMetadata(t.name, t.error_code, partitions,
                                                bool(getattr(t, "is_internal", False)), getattr(t, "topic_id", None))
        self._metadata_at = time.monotonic()
        for listener in self.metadata_listeners:
            listener()

    def _adopt_bootstrap_connections(self) -> None:
        """A bootstrap connection to an address that turns out to be node N becomes node N's connection."""
        by_address = {(b.host, b.port): b.node_id for b in self.brokers.values()}
        for node_id, conn in list(self._connections.items()):
            if node_id >= 0:
                continue
            del self._connections[node_id]
            real = by_address.get((conn.host, conn.port))
            current = self._connections.get(real) if real is not None else None
            if real is not None and (current is None or current.closed):
                conn.node_id = real
                self._connections[real] = conn
            else:
                asyncio.get_running_loop().create_task(conn.close())

    def _drop_connection(self, node_id: int) -> None:
        conn = self._connections.pop(node_id, None)
        if conn is not None:
            asyncio.get_running_loop().create_task(conn.close())

    async def list_all_topics(self) -> dict[str, TopicMetadata]:
        """Metadata of every topic in the cluster (not kept as tracked topics)."""
        self._check_open()
        conn = await self.any_connection()
        response = await self._metadata_request(conn, None)
        self._apply_metadata(response)
        return {t.name: self.topics[t.name] for t in response.topics}

    def topic_error(self, topic: str) -> int | None:
        """The topic's error code in the last metadata (0 when fine), None if never asked for."""
        meta = self.topics.get(topic)
        return None if meta is None else meta.error_code

    def partitions_for(self, topic: str) -> list[int] | None:
        """Sorted partition ids, or None when the topic is unknown or had an error."""
        meta = self.topics.get(topic)
        if meta is None or meta.error_code != 0:
            return None
        return sorted(meta.partitions)

    def leader_for(self, topic: str, partition: int) -> int | None:
        meta = self.topics.get(topic)
        if meta is None:
            return None
        p = meta.partitions.get(partition)
        if p is None or p.leader < 0:
            return None
        return p.leader

    async def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        """The connection to the partition's leader; metadata is refreshed once if the leader is unknown.

        Raises the topic's error (e.g. UNKNOWN_TOPIC_OR_PARTITION, retriable) or LEADER_NOT_AVAILABLE.
        """
        leader = self.leader_for(topic, partition)
        if leader is None:
            await self.refresh_metadata([topic], force=True)
            leader = self.leader_for(topic, partition)
        if leader is None:
            code = self.topic_error(topic) or 0
            meta = self.topics.get(topic)
            if code == 0 and meta is not None and partition not in meta.partitions:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            err = error_for(code or ErrorCode.LEADER_NOT_AVAILABLE,
                            f"no leader for {topic}-{partition}: "
                            f"{ErrorCode(code).name if code else 'LEADER_NOT_AVAILABLE'}")
            assert err is not None
            raise err
        return await self.connection(leader)

    # -- coordinators ---------------------------------------------------------------------------

    async def coordinator(self, key: str, key_type: int = GROUP, *, timeout: float | None = None) -> BrokerConnection:
        """The connection to the coordinator of a group (key_type 0) or transactional id (1).

        It is a connection of its own (kept under COORDINATOR_BASE - broker id), separate from the data
        connection to the same broker; its `node_id` is the broker's.

        FindCoordinator is retried while the answer is retriable (COORDINATOR_NOT_AVAILABLE while the
        internal topic is created, ...), up to `timeout` (request.timeout.ms by default).
        """
        self._check_open()
        cache_key = (key_type, key)
        node_id = self._coordinators.get(cache_key)
        if node_id is not None:
            try:
                return await self.connection(COORDINATOR_BASE - node_id)
            except NetworkError:
                self.invalidate_coordinator(key, key_type)
                raise
        task = self._finding.get(cache_key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._find_coordinator(key, key_type, self.request_timeout if timeout is None else timeout))
            self._finding[cache_key] = task

            def done(t: asyncio.Task, k: tuple[int, str] = cache_key) -> None:
                if self._finding.get(k) is t:
                    del self._finding[k]
                if not t.cancelled():
                    t.exception()

            task.add_done_callback(done)
        node_id = await asyncio.shield(task)
        return await self.connection(COORDINATOR_BASE - node_id)

    def invalidate_coordinator(self, key: str, key_type: int = GROUP) -> None:
        """Forget the coordinator (after NOT_COORDINATOR or a broken connection): the next call asks again."""
        self._coordinators.pop((key_type, key), None)

    def coordinator_id(self, key: str, key_type: int = GROUP) -> int | None:
        return self._coordinators.get((key_type, key))

    async def _find_coordinator(self, key: str, key_type: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            try:
                conn = await self.any_connection()
                node = await self._find_coordinator_once(conn, key, key_type)
                if node is not None:
                    self._coordinators[(key_type, key)] = node.node_id
                    known = self.brokers.get(node.node_id)
                    if known is None or (known.host, known.port) != (node.host, node.port):
                        self._drop_connection(node.node_id)
                        self._drop_connection(COORDINATOR_BASE - node.node_id)
                        self.brokers[node.node_id] = node
                    return node.node_id
                error: KafkaError = RetriableError(f"coordinator for {key!r} not available yet",
                                                   ErrorCode.COORDINATOR_NOT_AVAILABLE)
            except RetriableError as exc:
                error = exc
            attempt += 1
            delay = self._retry_delay(attempt)
            if time.monotonic() + delay >= deadline:
                raise KafkaTimeoutError(f"no coordinator for {key!r} (type {key_type}) "
                                        f"within {timeout:.1f}s: {error}", error.code)
            await asyncio.sleep(delay)

    async def _find_coordinator_once(self, conn: BrokerConnection, key: str, key_type: int) -> BrokerInfo | None:
        """The coordinator, or None for a retriable answer; raises the error for a non-retriable one."""
        cls = REQUESTS[ApiKey.FIND_COORDINATOR]
        version = conn.api_version(ApiKey.FIND_COORDINATOR, min(cls.max_version, 5), 0 if key_type == GROUP else 1)
        if version >= 4:
            data: dict[str, Any] = {"key_type": key_type, "coordinator_keys": [key]}
        elif version >= 1:
            data = {"key": key, "key_type": key_type}
        else:
            data = {"key": key}
        self.stats["find_coordinator_requests"] += 1
        response = await conn.call(ApiKey.FIND_COORDINATOR, data, version=version)
        answer = response.coordinators[0] if version >= 4 else response
        code = answer.error_code
        if code == 0:
            return BrokerInfo(answer.node_id, answer.host, answer.port)
        err = error_for(code, getattr(answer, "error_message", None))
        assert err is not None
        if err.retriable:
            return None
        raise err

    async def coordinator_call(
        self,
        key: str,
        key_type: int,
        api_key: int,
        data: dict[str, Any],
        *,
        version: int | None = None,
        error_of: Callable[[Any], int] = lambda response: response.error_code,
        timeout: float | None = None,
    ) -> Any:
        """Send a request to the coordinator of `key`, rediscovering it when it moved.

        NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE (read with `error_of`) and network errors
        forget the coordinator and retry; COORDINATOR_LOAD_IN_PROGRESS retries after a backoff.
        Any other answer, success or error, is returned for the caller to judge. Every
        coordinator API in Kafka is safe to resend, which is what makes the retry on a
        network error correct.
        """
        deadline = time.monotonic() + (self.request_timeout if timeout is None else timeout)
        attempt = 0
        while True:
            try:
                conn = await self.coordinator(key, key_type, timeout=max(0.001, deadline - time.monotonic()))
                response = await conn.call(api_key, data, version=version,
                                           timeout=max(0.001, deadline - time.monotonic()) + 1)
                code = error_of(response)
                if code not in _COORDINATOR_RETRY:
                    return response
                if code in _COORDINATOR_MOVED:
                    self.stats["coordinator_moved"] += 1
                    self.invalidate_coordinator(key, key_type)
                error: KafkaError = error_for(code) or RetriableError("coordinator busy")
            except NetworkError as exc:
                self.invalidate_coordinator(key, key_type)
                error = exc
            attempt += 1
            delay = self._retry_delay(attempt)
            if time.monotonic() + delay >= deadline:
                raise error
            await asyncio.sleep(delay)
