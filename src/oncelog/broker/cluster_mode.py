"""Cluster mode of one broker: the pieces of `cluster/` wired to this broker's storage and listener.

With `oncelog.coordination.connect` set, `Broker` creates one `ClusterMode` (and imports this module, hence kazoo,
only then). It owns the broker's metadata image and ZooKeeper session (`MetadataStore`), its `Controller` (active
while this broker holds /controller), the `ReplicaManager` with its fetchers behind `ReplicatedPartitionAccess`,
the inter-broker connections, and producer ids reserved on ZooKeeper. Its order of work:

start:  store (its two sessions: the broker's, and the shorter one that holds the controller seat; retried while
        ZooKeeper is unreachable) -> ACLs, SCRAM credentials and client quotas read from ZooKeeper and handed to
        the broker's security -> the data directory under ZooKeeper's cluster id ->
        replica manager wired into the flusher -> [the broker listens] -> registration (BrokerIdInUse: the broker
        exits non-zero) -> replicas opened and roles taken from the image -> controller -> producer ids.
stop:   controlled shutdown through the controller (leaderships move first, so clients see leader changes, not
        errors) -> [the broker stops listening] -> controller resigns -> fetchers, replica manager -> sessions
        closed (the registration goes at once) -> [storage closes].

Local replicas follow the image (the replica manager opens, reconfigures and deletes them through the log
manager); this module reports deleted copies to the store and wakes long polls on partitions that went.
Session loss (docs/cluster.md §5.4) is the store's and the replica manager's business; this module re-arms
acknowledgements when the lease is back and ends the broker if it cannot register again (its node.id taken).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..cluster.controller import Controller
from ..cluster.inter_broker import ControllerIsHere, ControllerUnavailable, InterBroker, is_forwarded
from ..cluster.metadata_image import MetadataImage
from ..cluster.metadata_store import (
    CONNECTED,
    LOST,
    ZK_SECURITY_KEYS,
    MetadataStore,
    StoreUnavailable,
    zk_security,
)
from ..cluster.producer_ids import ClusterProducerIds
from ..cluster.replica_fetcher import ReplicaFetcherManager
from ..cluster.replica_manager import ReplicaManager, Role
from ..cluster.txn_markers import MarkerChannel
from ..errors import ErrorCode
from . import coordinator_leadership
from .coordinator_leadership import follow_leadership
from .partition_access import ReplicatedPartitionAccess
from .txn_verification import LocalTxnCoordinator, TxnVerifier

if TYPE_CHECKING:
    from ..cluster.metadata_image import ImageDelta
    from ..cluster.topic_plans import NewTopic
    from ..config import BrokerConfig
    from ..coordinator.group import GroupCoordinator
    from ..coordinator.txn.coordinator import TransactionCoordinator
    from ..storage.flusher import GroupCommitFlusher
    from ..storage.log_manager import LogManager
    from .context import CoordinatorNode
    from .delayed import PartitionWatchers
    from .partition_access import PartitionAccess
    from .security_layer import BrokerSecurity

log = logging.getLogger("oncelog.cluster")


class ClusterHost(Protocol):
    """What cluster mode takes from the broker that hosts it (server.Broker), so this module never imports the
    server: the server sits above it and hands itself in. `partitions` and `producer_ids` are replaced by cluster
    mode's own; `fatal` is set when the broker must end."""

    config: BrokerConfig
    node_id: int
    data_dir: Path
    security: BrokerSecurity
    logs: LogManager
    flusher: GroupCommitFlusher
    watchers: PartitionWatchers
    partitions: PartitionAccess
    producer_ids: Any
    group_coordinator: GroupCoordinator | None
    txn_coordinator: TransactionCoordinator | None
    fatal: asyncio.Event

AUTO_CREATE_TIMEOUT_MS = 30000


def _names(partitions: list[Any], limit: int = 10) -> str:
    shown = ", ".join(f"{k[0]}-{k[1]}" if isinstance(k, (tuple, list)) else str(k) for k in partitions[:limit])
    return shown + (f" and {len(partitions) - limit} more" if len(partitions) > limit else "")


class _Alone(Exception):
    """No other broker is registered any more (controlled_shutdown)."""


class ClusterStartError(RuntimeError):
    """The broker cannot join the cluster (coordination service unreachable, node.id taken, foreign data)."""


class Routed(NamedTuple):
    """Where an admin request was carried out: `here` (the response as a dict) or by another broker (`raw`, the
    response body as it answered, and `decoded`)."""

    here: dict[str, Any] | None
    raw: bytes | None
    decoded: Any


def dict_error_codes(value: Any) -> Iterator[int]:
    """Every `error_code` in a response built as dicts and lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "error_code" and isinstance(item, int):
                yield item
            else:
                yield from dict_error_codes(item)
    elif isinstance(value, list):
        for item in value:
            yield from dict_error_codes(item)


class ClusterMode:
    """One broker's membership of a cluster (see the module docstring for the order of work)."""

    def __init__(self, broker: ClusterHost) -> None:
        self.broker = broker
        self.config = broker.config
        self.node_id = broker.node_id
        self.image = MetadataImage()
        self.store: MetadataStore | None = None
        self.controller: Controller | None = None
        self.replicas: ReplicaManager | None = None
        self.fetchers: ReplicaFetcherManager | None = None
        self.inter_broker: InterBroker | None = None
        self.marker_channel: MarkerChannel | None = None
        self.producer_ids: ClusterProducerIds | None = None
        self._broker_epoch: int = -1
        self.fatal_reason: str | None = None  # why the broker must end (its registration lost for good)
        self._creating: set[str] = set()  # topics auto-created by this broker, in flight
        self._tasks: set[asyncio.Task] = set()
        self._shut_down = False

    # -- start -------------------------------------------------------------------------------------------------
    async def connect(self) -> str:
        """Open the ZooKeeper session, read the whole image, and the ACLs, SCRAM credentials and client quotas every
        broker shares (docs/security.md §8 step 6); returns the cluster id. Before storage opens and the broker
        listens, so its first request sees every ACL."""
        loop = asyncio.get_running_loop()
        # ZooKeeper credentials and znode ACLs (zookeeper.set.acl; docs/security.md §9): refused here, before any
        # session, when they cannot be honoured; keys left unset take KAFKA_OPTS's -D properties, then the defaults
        security = zk_security({key: self.config[key] for key in ZK_SECURITY_KEYS if key in self.config.explicit},
                               os.environ)
        self.store = MetadataStore(self.config["oncelog.coordination.connect"],
                                   self.config["oncelog.coordination.session.timeout.ms"], loop, self.image,
                                   controller_session_timeout_ms=self.config["oncelog.controller.session.timeout.ms"],
                                   security=security)
        try:
            await self.store.start(self.config["oncelog.coordination.connection.timeout.ms"] / 1000)
            broker_security = self.broker.security
            stores = await self.store.start_security(acls=broker_security.authorizer is not None)
            broker_security.use_cluster_stores(stores.acls, stores.credentials, stores.quotas)
        except StoreUnavailable as exc:
            raise ClusterStartError(f"coordination service unreachable: {exc}") from None
        return self.store.cluster_id

    def wire(self) -> None:
        """After storage opened: the replica manager, its fetchers and the cluster's partition access."""
        broker, store = self.broker, self.store
        assert store is not None
        self.replicas = ReplicaManager(
            self.node_id, self.image, broker.logs, self.config,
            write_state=store.write_partition_state, lease=store,
            on_readable=broker.watchers.notify, wake_replica=broker.watchers.wake_replica,
            on_topic_deleted=self._report_deleted, flusher=broker.flusher)
        security = broker.security.inter_broker_security  # the inter-broker listener's client side
        self.fetchers = ReplicaFetcherManager(self.node_id, self.image, broker.logs, self.replicas, self.config,
                                              broker_epoch=lambda: self.broker_epoch, security=security)
        broker.partitions = ReplicatedPartitionAccess(self.replicas, self.image)
        self.inter_broker = InterBroker(self.node_id, self.image, self.config, security)
        self.producer_ids = ClusterProducerIds(self._allocate_producer_ids)
        broker.producer_ids = self.producer_ids  # type: ignore[assignment]

    def transaction_channels(self, coordinator: LocalTxnCoordinator) -> tuple[MarkerChannel, TxnVerifier]:
        """The transaction coordinator's reach beyond this broker: WriteTxnMarkers to other leaders, and the
        partitions' KIP-890 questions to other brokers' coordinators."""
        assert self.inter_broker is not None
        self.marker_channel = MarkerChannel(self.node_id, self.image, self.inter_broker)
        timeout_s = self.config["replica.socket.timeout.ms"] / 1000
        return self.marker_channel, TxnVerifier(self.node_id, self.image, self.inter_broker, coordinator, timeout_s)

    async def join(self, host: str, port: int, listeners: dict[str, Any] | None = None) -> None:
        """After the listeners are bound: register (`host`:`port` the inter-broker listener's address, `listeners`
        every endpoint and its protocol), take the replicas' roles, run the controller."""
        store = self.store
        assert store is not None and self.replicas is not None and self.fetchers is not None
        instance = hashlib.sha256(str(self.broker.data_dir.resolve()).encode()).hexdigest()[:16]
        try:
            self._broker_epoch = await store.register_broker(self.node_id, host, port, instance_id=instance,
                                                             extra=listeners)
        except StoreUnavailable as exc:
            raise ClusterStartError(f"cannot register with the coordination service: {exc}") from None
        store.on_state_change(self._on_store_state)
        self.image.subscribe(self._on_delta)
        # The coordinators load the partitions of their internal topics this broker leads, and drop them.
        follow_leadership(self.replicas, lambda: (self.broker.group_coordinator, self.broker.txn_coordinator))
        self.replicas.start(self.fetchers)
        self.controller = Controller(self.node_id, store, self.image, self.config)
        await self.controller.start()
        assert self.producer_ids is not None
        try:
            await self.producer_ids.start()
        except Exception as exc:  # reserved later, on first use
            log.warning("reserving producer ids failed: %s", exc)
        log.info("broker %d joined cluster %s (broker epoch %d, %d broker(s) registered, controller %d)",
                 self.node_id, store.cluster_id, self.broker_epoch, len(self.image.brokers),
                 self.image.controller_id)

    @property
    def broker_epoch(self) -> int:
        """This incarnation's epoch: the store's while registered (it changes when the registration is renewed,
        cluster/crash_probe.py), else the last one known (while the session is being recovered)."""
        epoch = self.store.broker_epoch if self.store is not None else None
        if epoch is not None:
            self._broker_epoch = epoch
        return self._broker_epoch

    def leaving(self) -> None:
        """Before the listener closes: a registration removed from now on (a controller's crash probe sees the
        closed port) is not renewed."""
        if self.store is not None:
            self.store.keep_registered = False

    async def _allocate_producer_ids(self, size: int) -> tuple[int, int]:
        assert self.store is not None
        return await self.store.allocate_producer_ids(self.node_id, size)

    # -- local replicas ----------------------------------------------------------------------------------------
    async def _report_deleted(self, topic: str, topic_id: bytes) -> None:
        assert self.store is not None
        await self.store.complete_topic_deletion(topic, topic_id, self.node_id)

    def _on_delta(self, delta: ImageDelta) -> None:
        if delta.topics_removed or delta.deletions:
            self.broker.watchers.notify_all()  # long polls on deleted partitions answer now

    # -- the session -------------------------------------------------------------------------------------------
    def _on_store_state(self, state: str) -> None:
        if state == CONNECTED and self.replicas is not None:
            assert self.store is not None
            self.replicas.lease_restored()
        elif state == LOST and self.store is not None and self.store.fatal_error is not None:
            self.fatal_reason = str(self.store.fatal_error)
            log.error("leaving: %s", self.fatal_reason)
            self.broker.fatal.set()

    # -- duties the broker delegates -----------------------------------------------------------------------------
    def expire_producers(self) -> int:
        assert self.replicas is not None
        return self.replicas.expire_producers(self.config["producer.id.expiration.ms"],
                                              self.config["transactional.id.expiration.ms"])

    def on_flushed(self, plog: Any) -> None:
        if self.replicas is not None:
            self.replicas.on_flushed(plog)

    def led_here(self) -> list[tuple[str, int]]:
        if self.replicas is None:
            return []
        return [k for k, r in self.replicas.replicas.items() if r.role is Role.LEADER]

    # -- stop --------------------------------------------------------------------------------------------------
    async def controlled_shutdown(self) -> None:
        """Ask the controller to move this broker's leaderships to other in-sync replicas, and wait until the
        image shows them moved (clients then see a leader change). Retried controlled.shutdown.max.retries
        times; the broker stops anyway afterwards (its session's end moves what is left).

        A broker left alone (no other broker registered: the last one of a cluster stopping) stops at once, and
        so does one that becomes alone while it waits for a controller or for a retry: nobody could take a
        leadership, and no other broker waits on it as a follower, so a retry would only wait
        (controlled.shutdown.retry.backoff.ms, and up to twice the session timeout per attempt for a controller
        that no longer exists)."""
        if (not self.config["controlled.shutdown.enable"] or self.store is None or self.broker_epoch < 0
                or self.store.state != CONNECTED):
            return
        loop = asyncio.get_running_loop()
        attempts = self.config["controlled.shutdown.max.retries"] + 1
        backoff = self.config["controlled.shutdown.retry.backoff.ms"] / 1000
        timeout = self.config["oncelog.coordination.session.timeout.ms"] / 1000 * 2
        started = loop.time()
        for attempt in range(1, attempts + 1):
            if self._alone():
                log.info("controlled shutdown: no other broker is registered; nothing to move")
                return
            deadline = loop.time() + timeout
            try:
                code, remaining = await self._unless_alone(self._ask_controlled_shutdown(deadline))
            except (ControllerUnavailable, StoreUnavailable) as exc:
                code, remaining = ErrorCode.REQUEST_TIMED_OUT, [f"({exc})"]
            except _Alone:
                log.info("controlled shutdown: every other broker left while this one waited; nothing to move")
                return
            if code == ErrorCode.NONE:
                kept = {tuple(k) for k in remaining if isinstance(k, (tuple, list))}
                await self._wait(lambda kept=kept: not any(s.leader == self.node_id and k not in kept
                                                           for k, s in self.image.states.items()), deadline)
                if not remaining:
                    log.info("controlled shutdown done in %.1f s: no leadership left here",
                             loop.time() - started)
                    return
                if not self._successor_possible(remaining):
                    log.warning("controlled shutdown: no other live in-sync replica can lead %s; stopping",
                                _names(remaining))
                    return
            log.warning("controlled shutdown attempt %d/%d: %s, still leading %s", attempt, attempts,
                        code.name, _names(remaining))
            if attempt < attempts:
                try:
                    await self._unless_alone(asyncio.sleep(backoff))
                except _Alone:
                    log.info("controlled shutdown: every other broker left; nothing to move")
                    return
            if self.store.state != CONNECTED:
                break
        log.warning("controlled shutdown incomplete; stopping anyway (the session's end moves what is left)")

    def _alone(self) -> bool:
        return not any(node_id != self.node_id for node_id in self.image.brokers)

    async def _unless_alone(self, work: Awaitable[Any]) -> Any:
        """`work`'s result, or _Alone (the work cancelled) as soon as the image shows no other broker.

        Watched with a listener and a plain Event, not `_wait`: its asyncio.wait_for can swallow a cancellation on
        Python 3.11 when the event is set at the same moment (an image change arriving with the controller's
        answer), and the watcher would then run on to its deadline with the shutdown waiting for it."""
        alone = asyncio.Event()

        def listener(delta: ImageDelta) -> None:
            if self._alone():
                alone.set()

        self.image.subscribe(listener)
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(alone.wait())
        try:
            if self._alone():
                alone.set()
            done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)     # bounded: the work is abandoned either way
            raise _Alone
        finally:
            self.image.unsubscribe(listener)
            waiter.cancel()
            if not task.done():
                task.cancel()

    def _successor_possible(self, remaining: list[Any]) -> bool:
        """Whether another live broker is in the ISR of any partition still led here (a retry could help)."""
        for key in remaining:
            state = self.image.states.get(tuple(key)) if isinstance(key, (tuple, list)) else None
            if state is None:
                return True
            if any(r != self.node_id and self.image.is_live(r) for r in state.isr):
                return True
        return False

    async def _ask_controlled_shutdown(self, deadline: float) -> tuple[ErrorCode, list[Any]]:
        assert self.inter_broker is not None and self.controller is not None
        while True:
            if self.controller.is_active:
                result = await self.controller.controlled_shutdown(self.node_id, self.broker_epoch)
                if result.code != ErrorCode.NOT_CONTROLLER:
                    return result.code, list(result.remaining)
            try:
                return await self.inter_broker.controlled_shutdown(self.broker_epoch, deadline)
            except ControllerIsHere:
                await self.inter_broker.wait_for_controller_change(
                    min(0.2, deadline - asyncio.get_running_loop().time()))
                if asyncio.get_running_loop().time() >= deadline:
                    raise ControllerUnavailable("this broker's controller did not become active") from None

    async def _wait(self, condition: Any, deadline: float) -> bool:
        """Wait until `condition()` holds on the image (checked at every image change), or the deadline."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def listener(delta: ImageDelta) -> None:
            changed.set()

        self.image.subscribe(listener)
        try:
            while not condition():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), remaining)
                except TimeoutError:
                    return condition()
            return True
        finally:
            self.image.unsubscribe(listener)

    async def wait_image(self, condition: Any, deadline: float) -> bool:
        """Wait until `condition()` holds on this broker's image, or `deadline` (loop time) passed."""
        return await self._wait(condition, deadline)

    def brokers_on(self, listener: Any) -> list[tuple[int, str, int, str | None]]:
        """(node id, host, port, rack) of every live broker on the listener a client came in on (a connection's
        ListenerRuntime, or None), as Metadata and DescribeCluster answer it: a broker without that listener is
        left out, as Kafka does."""
        name = getattr(listener, "name", None)
        out = []
        for node_id, info in sorted(self.image.brokers.items()):
            address = info.endpoint(name)
            if address is not None:
                out.append((node_id, address[0], address[1], info.rack))
        return out

    # -- the coordinators' internal topics ----------------------------------------------------------------------
    def coordinator_node(self, topic: str, partition: int, listener: str | None = None) -> CoordinatorNode | ErrorCode:
        """The leader of internal `topic`-`partition` (FindCoordinator's answer); while the topic does not exist it
        is created through the controller, once enough brokers are alive for its replication factor, and the
        answer meanwhile is COORDINATOR_NOT_AVAILABLE, which clients retry."""
        node = coordinator_leadership.coordinator_node(self.image, topic, partition, listener)
        if node is not None:
            return node
        spec = coordinator_leadership.internal_topic(self.config, topic)
        if coordinator_leadership.creatable(self.image, spec):
            self.create_in_background(spec)
        return ErrorCode.COORDINATOR_NOT_AVAILABLE

    # -- admin requests: the controller's business -----------------------------------------------------------
    def auto_create(self, name: str) -> None:
        """Metadata asked for a topic that does not exist (auto.create.topics.enable): have the controller create
        it with num.partitions and default.replication.factor, in the background. Kafka answers
        LEADER_NOT_AVAILABLE meanwhile and clients ask again."""
        from ..cluster.topic_plans import NewTopic

        self.create_in_background(NewTopic(name, self.config["num.partitions"],
                                           self.config["default.replication.factor"]))

    def create_in_background(self, spec: NewTopic) -> None:
        """Have the controller create `spec` (once at a time per name); the outcome is logged."""
        name = spec.name
        if name in self._creating or self.controller is None:
            return
        self._creating.add(name)
        partitions, rf = spec.num_partitions, spec.replication_factor

        async def create() -> None:
            from ..protocol import client_codecs as codecs
            from ..protocol.apis import ApiKey

            version = 7
            body = codecs.encode_request(ApiKey.CREATE_TOPICS, version, {
                "topics": [{"name": name, "num_partitions": partitions, "replication_factor": rf,
                            "assignments": [], "configs": [{"name": k, "value": v} for k, v in spec.configs.items()]}],
                "timeout_ms": AUTO_CREATE_TIMEOUT_MS, "validate_only": False})

            async def run_here() -> dict[str, Any]:
                assert self.controller is not None
                results = await self.controller.create_topics([spec])
                return {"topics": [{"name": name, "error_code": int(results[name].code),
                                    "error_message": results[name].message}]}

            loop = asyncio.get_running_loop()
            try:
                routed = await self.via_controller(ApiKey.CREATE_TOPICS, version, memoryview(body), None,
                                                   loop.time() + AUTO_CREATE_TIMEOUT_MS / 1000, run_here)
                if routed.here is not None:
                    code, message = routed.here["topics"][0]["error_code"], routed.here["topics"][0]["error_message"]
                else:
                    code, message = routed.decoded.topics[0].error_code, routed.decoded.topics[0].error_message
                if code == ErrorCode.NONE:
                    log.info("created topic %s on first use: %d partition(s), replication factor %d", name,
                             partitions, rf)
                elif code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.warning("creating topic %s on first use failed: %s %s", name, ErrorCode(code).name,
                                message or "")
            except ControllerUnavailable as exc:
                log.warning("creating topic %s on first use failed: %s", name, exc)
            finally:
                self._creating.discard(name)

        self.spawn(create())

    async def via_controller(self, api_key: int, version: int, body: memoryview, client_id: str | None,
                             deadline: float, run_here: Callable[[], Awaitable[dict[str, Any]]],
                             on_behalf: tuple[str, str] | None = None) -> Routed:
        """Carry out an admin request on the controller (docs/cluster.md §5.2): `run_here()` with this broker's
        controller when it is active (or when the request was forwarded here by another broker: it then answers
        NOT_CONTROLLER rather than forward again), else the same request forwarded to the controller the image
        names, again with the next one if the controller changes, for `on_behalf` (the client's principal and
        host, which the controller decides it as). Raises ControllerUnavailable at `deadline`."""
        assert self.controller is not None and self.inter_broker is not None
        loop = asyncio.get_running_loop()
        forwarded = is_forwarded(client_id)
        while True:
            if forwarded or self.controller.is_active:
                data = await run_here()
                if forwarded or ErrorCode.NOT_CONTROLLER not in set(dict_error_codes(data)):
                    return Routed(data, None, None)
            try:
                raw, decoded = await self.inter_broker.to_controller(api_key, version, body, deadline, on_behalf)
                return Routed(None, raw, decoded)
            except ControllerIsHere:
                if self.controller.is_active:
                    continue
                await self.inter_broker.wait_for_controller_change(min(0.2, deadline - loop.time()))
                if loop.time() >= deadline:
                    raise ControllerUnavailable("this broker is named controller but is not acting yet") from None

    async def stop(self) -> None:
        """After the listener closed: the controller resigns, replication stops, the session ends."""
        if self._shut_down:
            return
        self._shut_down = True
        self.image.unsubscribe(self._on_delta)
        if self.controller is not None:
            await self.controller.stop()
        if self.fetchers is not None:
            await self.fetchers.stop()
        if self.replicas is not None:
            await self.replicas.stop()
        if self.producer_ids is not None:
            await self.producer_ids.stop()
        if self.marker_channel is not None:
            self.marker_channel.close()
        if self.inter_broker is not None:
            await self.inter_broker.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.store is not None:
            await self.store.close()

    def spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
