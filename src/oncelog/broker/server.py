"""The broker process: wires storage, dispatch and background duties together.

One asyncio loop runs every connection and every partition append; the only work
that leaves the loop is fsync (the group-commit flusher's worker thread) and the
Prometheus scrape thread.

With `oncelog.coordination.connect` set the broker joins a cluster (`cluster_mode.ClusterMode`, imported only
then: the single node never loads kazoo). In a cluster the group and transaction coordinators serve the
partitions of their internal topics this broker leads (transaction markers reach only partitions led here so far).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from pathlib import Path
from typing import Any

from ..config import BrokerConfig, ConfigError
from ..coordinator.group import GroupCoordinator
from ..coordinator.txn.coordinator import TransactionCoordinator
from ..coordinator.txn.producer_ids import ProducerIdManager
from ..errors import ErrorCode
from ..security.quotas import normal_ip
from ..storage.cleaner.manager import LogCleaner
from ..storage.flusher import GroupCommitFlusher
from ..storage.log_manager import LogManager
from ..storage.syncfs import supported as syncfs_supported
from .connection import Connection
from .context import CoordinatorNode
from .delayed import PartitionWatchers
from .dispatch import Dispatcher
from .handlers import HANDLERS, INTERNAL_HANDLERS
from .loop_monitor import LoopMonitor
from .metrics import BrokerMetrics
from .partition_access import LocalPartitionAccess, PartitionAccess
from .security_layer import BrokerSecurity, SecurityConfigError
from .tls_accept import TlsAcceptor

log = logging.getLogger("oncelog.broker")


class StartError(RuntimeError):
    """The broker cannot start as configured; the message says why (the process exits non-zero with it)."""


def now_ms() -> int:
    return int(time.time() * 1000)


def bind_listener(host: str, port: int) -> socket.socket:
    """The broker's listening socket, bound but not yet listening: `oncelog serve` binds it before it loads any
    log, so a port already taken ends the start at once with one line instead of an asyncio bind error after
    every log was opened. The same socket is handed to the server (`Broker(listen_socket=...)`), so no other
    process can take the port between a check and the real bind; until the server listens, connections are
    refused rather than left waiting in a backlog while logs load. One address, the first the host resolves to,
    as a Kafka listener binds one. StartError says why it cannot."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise StartError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        # as asyncio's create_server does: a restart need not wait for the last run's connections in TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartError(f"{host}:{port} is already in use by another process") from None
        raise StartError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


class Broker:
    """One broker. Everything below it names it through Protocols it satisfies structurally:
    `context.BrokerServices` (handlers), `connection.ConnectionHost` (connections) and
    `coordinator.host.TransactionHost` / `GroupHost` (the coordinators); keep their members here."""

    def __init__(
        self,
        config: BrokerConfig,
        data_dir: str | Path,
        host: str = "127.0.0.1",
        port: int = 9092,
        metrics_listen: tuple[str, int] | None = None,
        listen_socket: socket.socket | None = None,
        bound_sockets: list[socket.socket] | None = None,
    ) -> None:
        self.config = config
        self.data_dir = Path(data_dir)
        # Listeners, TLS contexts, SASL mechanisms and credentials: found wrong here, the start ends at once.
        try:
            self.security = BrokerSecurity(config, self.data_dir, (host, port))
        except SecurityConfigError as exc:
            raise StartError(str(exc)) from None
        first = self.security.listeners[0].spec
        self.host = first.host
        self.port = first.port
        # Bound before the broker was made (`bind_listener`); None: bind host:port when starting. `bound_sockets`:
        # the same for every listener, in the order of `listeners` (oncelog serve binds them all first).
        self._listen_socket = listen_socket
        self._bound_sockets: list[socket.socket] = list(bound_sockets or [])
        self.node_id: int = config["node.id"]
        self.metrics = BrokerMetrics()
        self.loop_monitor = LoopMonitor(self.metrics, config["oncelog.loop.stall.threshold.ms"])
        self.metrics_listen = metrics_listen
        self.metrics_port: int | None = None
        self.watchers = PartitionWatchers()
        self.flusher = GroupCommitFlusher(
            fsync_enabled=config["oncelog.fsync.enable"], on_high_watermark=self._on_high_watermark,
            sync_threads=config["oncelog.fsync.threads"], on_round=self.metrics.observe_flush_round,
            slow_round_ms=config["oncelog.fsync.slow.round.ms"], use_syncfs=self._use_syncfs(config),
        )
        self.logs = LogManager(self.data_dir, config, self.flusher)
        # Which partitions this broker serves and how acks=all completes: the single node leads them all.
        self.partitions: PartitionAccess = LocalPartitionAccess(self.logs, self.flusher, self.node_id)
        self.producer_ids = ProducerIdManager(self.data_dir / "__oncelog_meta" / "producer-ids.json")
        self.txn_coordinator: TransactionCoordinator | None = None
        self.group_coordinator: GroupCoordinator | None = None
        self.cleaner: LogCleaner | None = None  # the log cleaner (single node; storage/cleaner/)
        # Cluster mode: markers for other brokers' partitions and KIP-890 questions to other brokers' coordinators.
        self.marker_channel: Any = None
        self.txn_verifier: Any = None
        self.dispatcher = Dispatcher(self, dict(HANDLERS), INTERNAL_HANDLERS)
        # Cluster mode (None: the single node). Set fatal when the broker must end (its node.id was taken while
        # its session was lost); `fatal_reason` says why.
        self.cluster: Any = None
        self.fatal = asyncio.Event()
        if config["oncelog.coordination.connect"]:
            from .cluster_mode import ClusterMode

            self.cluster = ClusterMode(self)
        self.connections: set[Connection] = set()
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    # -- identity ---------------------------------------------------------------------------------
    @property
    def cluster_id(self) -> str:
        return self.logs.cluster_id

    @property
    def fatal_reason(self) -> str | None:
        return None if self.cluster is None else self.cluster.fatal_reason

    @property
    def advertised(self) -> tuple[str, int]:
        """host:port of the first listener as clients are told it (the address a cluster registers)."""
        return self.security.listeners[0].advertised

    def advertised_for(self, listener: Any) -> tuple[str, int]:
        """host:port clients of `listener` (a connection's) are told: Metadata answers on the listener asked."""
        return listener.advertised if listener is not None else self.advertised

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start serving. Raises StartError when the broker cannot (after releasing what it opened)."""
        try:
            await self._start()
        except BaseException as exc:
            await self._abort()
            if self.cluster is not None:
                from ..cluster.metadata_store import StoreError
                from .cluster_mode import ClusterStartError

                if isinstance(exc, (ClusterStartError, StoreError)):
                    raise StartError(str(exc)) from None
            from ..storage.log_manager import LogDirError

            if isinstance(exc, LogDirError):
                raise StartError(str(exc)) from None
            raise

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.cluster is not None:
            # The coordinators own no partition yet: each loads those of its internal topic this broker comes to
            # lead (cluster_mode follows the replica manager's roles) and its log is created on first need.
            self.logs.startup(cluster_id=await self.cluster.connect())
            self.cluster.wire()
            self.txn_coordinator = TransactionCoordinator(self)
            self.marker_channel, self.txn_verifier = self.cluster.transaction_channels(self.txn_coordinator)
            self.logs.set_verify_transaction(self.txn_verifier.check)
            self.group_coordinator = GroupCoordinator.for_broker(self)
        else:
            self.logs.startup()
            self.producer_ids.load()
            self.txn_coordinator = TransactionCoordinator(self)
            self.txn_coordinator.startup()
            self.logs.set_verify_transaction(self.txn_coordinator.verify_partition)
            self.group_coordinator = GroupCoordinator.for_broker(self)
            self.group_coordinator.startup()
        self.flusher.start()
        self.loop_monitor.start()
        if self.config["log.cleaner.enable"]:
            # Compacted topics (__consumer_offsets and __transaction_state included) are cleaned in worker
            # processes; in a cluster every replica cleans its own copy, below its high watermark.
            self.cleaner = LogCleaner(self.data_dir, self.logs.all_partitions,
                                      workers=self.config["log.cleaner.threads"],
                                      backoff_ms=self.config["log.cleaner.backoff.ms"],
                                      dedupe_buffer_bytes=self.config["log.cleaner.dedupe.buffer.size"],
                                      io_max_bytes_per_second=self.config["log.cleaner.io.max.bytes.per.second"])
            self.cleaner.start()
        if self.txn_coordinator is not None:
            self.txn_coordinator.start()
        self.group_coordinator.start()
        await self._listen(loop)
        if self.cluster is not None:
            await self.cluster.join(*self.security.inter_broker_listener.advertised, self.security.registration())
        if self.metrics_listen is not None:
            self.metrics.watch_partitions(self._partition_snapshot, self.logs.all_partitions)
            self.metrics.watch_transactions(self)
            self.metrics.watch_cleaner(lambda: self.cleaner, str(self.data_dir))
            self.metrics_port = self.metrics.serve(*self.metrics_listen)
        self._tasks = [
            loop.create_task(self._every(self.config["log.retention.check.interval.ms"], self._retention)),
            loop.create_task(self._every(self.config["log.flush.offset.checkpoint.interval.ms"], self._checkpoint)),
            loop.create_task(self._every(min(10000, self.config["connections.max.idle.ms"]), self._close_idle)),
            loop.create_task(
                self._every(self.config["producer.id.expiration.check.interval.ms"],
                            self.logs.expire_producers if self.cluster is None else self.cluster.expire_producers)
            ),
        ]
        if self.security.jwks:  # OAUTHBEARER's key sets, refreshed off the loop
            self._tasks.append(loop.create_task(self._every(60000, self.security.refresh_keys)))
        log.info("broker %d started, cluster id %s, data in %s", self.node_id, self.cluster_id, self.data_dir)

    async def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """One server per listener, all on this loop; a TLS listener's handshake is bounded by
        oncelog.authentication.timeout.ms (a client that never finishes it is dropped)."""
        timeout = self.config["oncelog.authentication.timeout.ms"] / 1000
        for index, listener in enumerate(self.security.listeners):
            def factory(listener: Any = listener) -> asyncio.Protocol:
                if listener.ssl_context is None:
                    return Connection(self, listener)
                # admitted at accept, then TLS (tls_accept.py); the context is read per connection, so a
                # reloaded key store serves the next handshake
                return TlsAcceptor(Connection(self, listener), listener.ssl_context, timeout)

            sock = self._listen_socket if index == 0 else None
            if sock is None and index < len(self._bound_sockets):
                sock = self._bound_sockets[index]
            if sock is not None:
                server = await loop.create_server(factory, sock=sock, backlog=1024)
            else:
                server = await loop.create_server(factory, listener.spec.host or None, listener.spec.port,
                                                  backlog=1024)
            self._servers.append(server)
            listener.port = server.sockets[0].getsockname()[1]
            log.info("listener %s (%s) on %s:%d", listener.name, listener.spec.protocol,
                     listener.spec.host, listener.port)
        self.host, self.port = self._servers[0].sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        if self._stopping:
            return
        if self.cluster is not None and not self.fatal.is_set():
            # Leaderships move while this broker still serves: clients follow them instead of meeting errors.
            await self.cluster.controlled_shutdown()
        await self._abort()

    async def _abort(self) -> None:
        """Close everything opened so far (also after a failed start)."""
        if self._stopping:
            return
        self._stopping = True
        if self.cluster is not None:
            self.cluster.leaving()
        for server in self._servers:
            server.close()
        if not self._servers:
            for sock in (self._listen_socket, *self._bound_sockets):
                if sock is not None:
                    sock.close()
        for conn in list(self.connections):
            conn.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.cluster is not None:
            await self.cluster.stop()
        if self.txn_coordinator is not None:
            await self.txn_coordinator.stop()
        if self.group_coordinator is not None:
            await self.group_coordinator.stop()
        if self.cleaner is not None:
            await self.cleaner.stop()
        await self.flusher.stop()
        self.loop_monitor.stop()
        if self.logs.cluster_id:  # storage was opened
            self.logs.shutdown()
        self.metrics.stop()
        log.info("broker stopped cleanly")

    async def _every(self, interval_ms: int, action: Any) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                result = action()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("background task %s failed", getattr(action, "__name__", action))

    async def _checkpoint(self) -> None:
        """The periodic checkpoint: offsets taken on the loop, the files written (and fsynced) off it."""
        await asyncio.to_thread(self.logs.write_checkpoints, self.logs.checkpoint_offsets())

    def _retention(self) -> None:
        self.logs.run_retention(now_ms())

    def _close_idle(self) -> None:
        limit = self.config["connections.max.idle.ms"] / 1000
        now = time.monotonic()
        for conn in list(self.connections):
            if now - conn.last_active > limit:
                log.info("closing idle connection from %s", conn.peer)
                conn.close()

    # -- connections ------------------------------------------------------------------------------
    def register_connection(self, conn: Connection) -> bool:
        """Admit a connection whose transport is made (a plaintext listener's), muting it for a creation-rate
        throttle; False when refused."""
        delay = self.admit_connection(conn)
        if delay is None:
            return False
        if delay > 0:
            conn.mute_for(delay)
        return True

    def admit_connection(self, conn: Connection) -> float | None:
        """Count a new connection in, or say why not (logged) and refuse it (None); otherwise the seconds its
        first read waits (max.connection.creation.rate). In Kafka's order (ConnectionQuotas.inc):
        max.connection.creation.rate first (every new connection counts; one over the rate is read only after
        its throttle), then max.connections, then max.connections.per.ip."""
        quotas = self.security.connection_quotas
        delay_ms = quotas.creation_delay_ms(time.monotonic() * 1000)
        if len(self.connections) >= self.config["max.connections"]:
            log.warning("closing connection from %s: max.connections reached", conn.peer)
            return None
        if quotas.limits_ips:
            ip = normal_ip(conn.client_host)
            limit = quotas.admit(ip)
            if limit is not None:
                log.info("Rejected connection from %s, address already has the configured maximum of %d "
                         "connections.", ip, limit)
                return None
        self.connections.add(conn)
        self.metrics.connections.inc()
        if delay_ms > 0:
            listener = conn.listener.name if conn.listener is not None else ""
            self.metrics.connection_accept_throttle_time.labels(listener).observe(delay_ms)
        return delay_ms / 1000

    def unregister_connection(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            if self.security.connection_quotas.limits_ips:
                self.security.connection_quotas.release(normal_ip(conn.client_host))

    # -- coordinators -------------------------------------------------------------------------------
    def coordinator_node(self, topic: str, partition: int, listener: Any = None) -> CoordinatorNode | ErrorCode:
        """FindCoordinator: who coordinates the keys of internal `topic`-`partition`. The single node: itself; a
        cluster: that partition's leader (the topic created through the controller on first need)."""
        if self.cluster is not None:
            return self.cluster.coordinator_node(topic, partition, listener.name if listener is not None else None)
        host, port = self.advertised_for(listener)
        return CoordinatorNode(self.node_id, host, port)

    # -- transactions -------------------------------------------------------------------------------
    async def init_transactional_producer(self, req: Any, version: int) -> dict[str, Any]:
        if self.txn_coordinator is None:
            return {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "producer_id": -1, "producer_epoch": -1}
        result = await self.txn_coordinator.init_producer_id(
            req.transactional_id, req.transaction_timeout_ms,
            req.producer_id if version >= 3 else -1, req.producer_epoch if version >= 3 else -1, version,
        )
        return {"error_code": result.error, "producer_id": result.producer_id, "producer_epoch": result.producer_epoch}

    # -- partitions -------------------------------------------------------------------------------
    @staticmethod
    def _use_syncfs(config: BrokerConfig) -> bool:
        """oncelog.fsync.method=syncfs, refused at start where syncfs would not report an I/O error."""
        if config["oncelog.fsync.method"] != "syncfs":
            return False
        if not config["oncelog.fsync.enable"]:
            log.warning("oncelog.fsync.method=syncfs has no effect: oncelog.fsync.enable=false, so nothing is synced")
            return False
        reason = syncfs_supported()
        if reason is not None:
            raise ConfigError(f"oncelog.fsync.method=syncfs: {reason}")
        log.info("group commit: a round of several files is one syncfs per filesystem (oncelog.fsync.method=syncfs; "
                 "everything dirty on the data directory's filesystem is written with it)")
        return True

    def _on_high_watermark(self, plog: Any) -> None:
        self.watchers.notify((plog.topic, plog.partition))
        if self.cluster is not None:
            self.cluster.on_flushed(plog)  # a follower's durable end, a leader's high watermark

    def _partition_snapshot(self):
        return [(plog.topic, plog.partition, plog) for plog in list(self.logs.all_logs())]
