"""Cluster metadata on ZooKeeper: the znode layout of docs/cluster.md §2, its writes, its watches, the session.

The facade over `cluster/store/` (docs/metadata-store.md): the session, its lease and the bridge from kazoo's threads
to asyncio are store/session.py's; this module owns:

- broker registration (an ephemeral znode whose czxid is the broker epoch), the controller seat (an ephemeral
  /controller created together with the increment of /controller_epoch, in one transaction), and every write the
  controller and partition leaders make: compare-and-set on the znode version, and for the controller a check of
  /controller_epoch's version in the same multi-op, so a deposed controller's writes fail as a unit;
- watches that re-read what changed and apply it to the `MetadataImage`, on the asyncio loop;
- what a change of session means: after a new session the re-registration (a new broker epoch), then a full read,
  then CONNECTED announced to the listeners.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kazoo.exceptions import (
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import EventType

from .connect import parse_connect
from .metadata_image import (
    NO_CONTROLLER,
    BrokerInfo,
    MetadataImage,
    PartitionAssignment,
    PartitionState,
    TopicInfo,
)
from .store import znodes
from .store.errors import (  # noqa: F401 - callers import these names from here
    CONNECTED,
    LOST,
    SUSPENDED,
    BrokerIdInUse,
    NotController,
    RequestTooLarge,
    StaleVersion,
    StoreError,
    StoreUnavailable,
    TopicExists,
    UnknownTopic,
)
from .store.registration import BrokerRegistration, ControllerSeat
from .store.session import Build, SessionHooks, StoreSession
from .store.writes import MetadataWrites
from .store.znodes import (  # noqa: F401 - callers import these names from here
    BROKERS,
    CLUSTER_ID,
    CONTROLLER,
    CONTROLLER_EPOCH,
    DEFAULT_CHROOT,
    DELETING,
    FORMAT_VERSION,
    MAX_MULTI_BYTES,
    PRODUCER_ID_BLOCK,
    TOPIC_CONFIGS,
    TOPICS,
    decode_topic_id,
    encode_topic_id,
    new_cluster_id,
)

log = logging.getLogger(__name__)


# ---- the store ---------------------------------------------------------------------------------------------------

class MetadataStore:
    """One broker's ZooKeeper session: its registration, its writes, and the watches that feed its image."""

    def __init__(
        self,
        connect: str,
        session_timeout_ms: int,
        loop: asyncio.AbstractEventLoop,
        image: MetadataImage,
        chroot: str = DEFAULT_CHROOT,
        controller_session_timeout_ms: int | None = None,
    ) -> None:
        parsed = parse_connect(connect)
        self.connect = connect
        self.servers = parsed.servers
        self.root = (parsed.chroot or chroot).rstrip("/")
        self.session_timeout_ms = session_timeout_ms
        self.seat_timeout_ms = controller_session_timeout_ms
        self.loop = loop
        self.image = image
        hooks = SessionHooks(main_lost=self._main_session_lost, main_replaced=self._main_session_replaced,
                             resync=self._resync, seat_lost=self._seat_session_lost,
                             seat_replaced=self._seat_session_replaced)
        # MAX_MULTI_BYTES is read from this module at each request: lowering it here is how tests make small
        # topics reach the limit.
        self.session = StoreSession(self.servers, self.root, session_timeout_ms, loop, hooks,
                                    controller_session_timeout_ms, max_multi_bytes=lambda: MAX_MULTI_BYTES)
        # Controller writes call `_commit` through this, looked up at each call: a test that replaces the store's
        # `_commit` sees every one of them.
        def commit(build: Build, controller_epoch: int | None) -> Awaitable[list[Any]]:
            return self._commit(build, controller_epoch)

        self.registration = BrokerRegistration(self.session, image, self._read_broker, commit)
        self.seat = ControllerSeat(self.session, image, self._read_controller)
        # Topics whose znode says `creating` (created in steps by a controller, not visible yet).
        self.pending_creations: set[str] = set()
        self.writes = MetadataWrites(self.session, image, commit, self.pending_creations, read_topic=self._read_topic,
                                     read_state=self._read_state, read_deletion=self._read_deletion)
        self.cluster_id = ""
        self.fatal_error: BaseException | None = None
        self._data_watch = self._on_watch                       # one callable per kind: kazoo keeps a set per path
        self._child_watch = self._on_child_watch

    # ---- paths -----------------------------------------------------------------------------------------------

    def _p(self, rel: str) -> str:
        return self.session.path(rel)

    @staticmethod
    def topic_path(topic: str) -> str:
        return znodes.topic_path(topic)

    @staticmethod
    def state_path(topic: str, partition: int) -> str:
        return znodes.state_path(topic, partition)

    # ---- the session (store/session.py) ------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        return self.session.timeout_s

    @property
    def state(self) -> str:
        return self.session.state

    @property
    def seat_state(self) -> str:
        return self.session.seat_state

    @property
    def negotiated_ms(self) -> dict[str, int]:
        return self.session.negotiated_ms

    @property
    def session_id(self) -> int | None:
        return self.session.session_id

    @property
    def seat_session_id(self) -> int | None:
        """The session that owns /controller when this broker holds it (ephemeralOwner)."""
        return self.session.seat_session_id

    @property
    def controller_usable(self) -> bool:
        """Whether this broker may act as controller as far as its sessions go: the main one (its registration,
        its writes) and the seat's are both CONNECTED."""
        return self.session.controller_usable

    def client_id(self) -> tuple[int, bytes] | None:
        """kazoo's (session id, password): lets a test expire this session from another client."""
        return self.session.client_id()

    def lease_valid(self) -> bool:
        """Whether acks=all may still be acknowledged (docs/cluster.md §5.4); see StoreSession.lease_valid."""
        return self.session.lease_valid()

    def on_state_change(self, listener: Callable[[str], None]) -> None:
        """`listener(state)` on the loop at each change of `state`; CONNECTED comes after the image is re-read."""
        self.session.on_state_change(listener)

    def on_seat_state_change(self, listener: Callable[[str], None]) -> None:
        """`listener(state)` on the loop at each change of `seat_state` (only with a seat session)."""
        self.session.on_seat_state_change(listener)

    # ---- lifecycle -------------------------------------------------------------------------------------------

    async def start(self, timeout_s: float, cluster_id: str | None = None) -> None:
        """Connect (retrying with backoff and logging while the service is unreachable), create the layout,
        create the cluster id if absent (`cluster_id` proposes one), read the whole image and set its watches.
        Raises StoreUnavailable if no session opened within `timeout_s`."""
        deadline = self.loop.time() + timeout_s
        await self.session.open(deadline, timeout_s)
        await self._ensure_layout(cluster_id)
        await self.session.open_seat(deadline, timeout_s)
        await self._full_read()
        self.session.set_state(CONNECTED)
        self.session.start_lease()
        log.info("metadata store connected to %s%s, cluster id %s", self.servers, self.root, self.cluster_id)

    async def close(self) -> None:
        """End the sessions (ephemeral znodes go at once) and stop kazoo's threads."""
        await self.session.close()
        self.registration.forget()
        self.seat.forget()

    async def _ensure_layout(self, cluster_id: str | None) -> None:
        for rel in ("", BROKERS, TOPICS, TOPIC_CONFIGS, DELETING):
            await self._call(self._kz().ensure_path_async(self._p(rel) or "/"))
        try:
            await self._call(self._kz().create_async(self._p(CONTROLLER_EPOCH), znodes.dump({"controller_epoch": 0})))
        except NodeExistsError:
            pass
        proposed = cluster_id or new_cluster_id()
        try:
            await self._call(self._kz().create_async(self._p(CLUSTER_ID), znodes.dump({"id": proposed})))
        except NodeExistsError:
            pass
        data, _ = await self._call(self._kz().get_async(self._p(CLUSTER_ID)))
        self.cluster_id = str(znodes.load(data)["id"])
        self.image.apply_cluster_id(self.cluster_id)

    # ---- what a change of session means (the session tells, SessionHooks) ----------------------------------

    def _main_session_lost(self) -> None:
        self.registration.session_lost()
        self.seat.main_session_lost()

    def _main_session_replaced(self) -> None:
        self.seat.forget()
        log.info("new ZooKeeper session %s after expiry: registering again and re-reading metadata",
                 hex(self.session.session_id or 0))

    async def _resync(self) -> None:
        """After a reconnection kazoo has dropped every watch: read everything again, retried while connected.
        After a new session (the old one expired) register again first, which gives this broker a new epoch; only
        then announce CONNECTED, so a listener that sees it sees this session's epoch and image."""
        backoff = 0.2
        while self.session.connected:
            try:
                await self.registration.renew_after_new_session()
                await self._full_read()
                self.session.set_state(CONNECTED)
                return
            except asyncio.CancelledError:
                raise
            except BrokerIdInUse as exc:
                log.error("cannot register again: %s", exc)
                self.fatal_error = exc
                self.session.set_state(LOST)
                return
            except Exception:
                log.exception("re-reading metadata after reconnect failed; retrying in %.1fs", backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.timeout_s / 3)

    def _seat_session_lost(self) -> None:
        self.seat.seat_session_lost()

    def _seat_session_replaced(self) -> None:
        self.seat.forget()

    # ---- registration and the controller seat (store/registration.py) -----------------------------------------

    @property
    def broker_epoch(self) -> int | None:
        return self.registration.broker_epoch

    @property
    def keep_registered(self) -> bool:
        """False once the broker is leaving: a removed registration stays removed."""
        return self.registration.keep_registered

    @keep_registered.setter
    def keep_registered(self, keep: bool) -> None:
        self.registration.keep_registered = keep

    async def register_broker(self, node_id: int, host: str, port: int, rack: str | None = None, *,
                              instance_id: str | None = None, extra: Mapping[str, Any] | None = None) -> int:
        """Create /brokers/ids/<node_id> (ephemeral) and return the broker epoch (its czxid); see
        BrokerRegistration.register. Registers again by itself after a session expiry."""
        return await self.registration.register(node_id, host, port, rack, instance_id=instance_id, extra=extra)

    async def expire_registration(self, node_id: int, broker_epoch: int, controller_epoch: int) -> bool:
        """Delete broker `node_id`'s registration if it is still the incarnation `broker_epoch`, as this controller.
        Returns whether it was deleted."""
        return await self.registration.expire(node_id, broker_epoch, controller_epoch)

    @property
    def controller_epoch(self) -> int | None:
        """The controller epoch this broker holds, or None."""
        return self.seat.epoch

    async def try_become_controller(self, node_id: int, broker_epoch: int) -> int | None:
        """Take the seat if it is free: the new controller epoch, or None when another broker holds it."""
        return await self.seat.try_take(node_id, broker_epoch)

    async def resign_controller(self, controller_epoch: int) -> None:
        await self.seat.resign(controller_epoch)

    async def seat_still_held(self) -> bool:
        return await self.seat.still_held()

    async def release_seat(self) -> bool:
        return await self.seat.release()

    async def _commit(self, build: Build, controller_epoch: int | None, *, seat: bool = False) -> list[Any]:
        """The multi-op behind this controller's epoch check that every controller write goes through
        (ControllerSeat.commit)."""
        return await self.seat.commit(build, controller_epoch, seat=seat)

    # ---- requests ------------------------------------------------------------------------------------------

    def _kz(self) -> Any:
        return self.session.kz()

    def _seat_kz(self) -> Any:
        return self.session.seat_kz()

    async def _call(self, async_result: Any, timeout: float | None = None, *, confirms: bool = True) -> Any:
        return await self.session.call(async_result, timeout, confirms=confirms)

    def _require_connected(self) -> None:
        self.session.require_connected()

    # ---- writes (store/writes.py) ----------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        topic_id: bytes,
        assignment: Mapping[int, Sequence[int]],
        configs: Mapping[str, str],
        controller_epoch: int,
        initial: Mapping[int, tuple[int, Sequence[int]]] | None = None,
    ) -> TopicInfo:
        """Create a topic as the controller (in steps when too big for one request); see MetadataWrites."""
        return await self.writes.create_topic(name, topic_id, assignment, configs, controller_epoch, initial)

    async def abandon_creations(self, controller_epoch: int, only: str | None = None) -> list[str]:
        return await self.writes.abandon_creations(controller_epoch, only)

    async def write_partition_states(self, changes: Sequence[tuple[str, int, PartitionState, int]],
                                     controller_epoch: int) -> None:
        await self.writes.write_partition_states(changes, controller_epoch)

    async def write_partition_state(self, topic: str, partition: int, new: PartitionState, expected_version: int,
                                    controller_epoch: int | None) -> int:
        return await self.writes.write_partition_state(topic, partition, new, expected_version, controller_epoch)

    async def write_assignment(
        self,
        topic: str,
        assignment: Mapping[int, PartitionAssignment | Sequence[int]],
        expected_version: int,
        controller_epoch: int,
        *,
        new_partitions: Mapping[int, PartitionState] | None = None,
        states: Mapping[int, tuple[PartitionState, int]] | None = None,
    ) -> int:
        return await self.writes.write_assignment(topic, assignment, expected_version, controller_epoch,
                                                  new_partitions=new_partitions, states=states)

    async def delete_topic(self, name: str, controller_epoch: int, expected_version: int | None = None) -> None:
        await self.writes.delete_topic(name, controller_epoch, expected_version)

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], expected_version: int,
                                controller_epoch: int) -> int:
        return await self.writes.set_topic_configs(topic, configs, expected_version, controller_epoch)

    async def complete_topic_deletion(self, topic: str, topic_id: bytes, node_id: int) -> None:
        await self.writes.complete_topic_deletion(topic, topic_id, node_id)

    async def allocate_producer_ids(self, node_id: int, block_size: int) -> tuple[int, int]:
        return await self.writes.allocate_producer_ids(node_id, block_size)

    # ---- reads (each sets its watch and applies to the image) ------------------------------------------------

    async def refresh_brokers(self) -> None:
        """Re-read /brokers/ids and every registration (a new controller does this first, §5.3)."""
        await self._read_brokers()

    async def read_partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """Re-read one state znode (after a lost CAS) and return what the image holds."""
        await self._read_state(topic, partition)
        return self.image.partition(topic, partition)

    async def read_topic(self, name: str) -> TopicInfo | None:
        return await self._read_topic(name, full=True)

    async def _full_read(self) -> None:
        with self.image.batch():
            await asyncio.gather(self._read_brokers(), self._read_controller(), self._read_topics(full=True),
                                 self._read_deletions())

    async def _read_brokers(self) -> None:
        try:
            ids = await self._call(self._kz().get_children_async(self._p(BROKERS), watch=self._child_watch))
        except NoNodeError:
            ids = []
        infos = await asyncio.gather(*(self._get_broker(int(i)) for i in ids if i.isdigit()))
        self.image.apply_brokers([i for i in infos if i is not None])

    async def _get_broker(self, node_id: int) -> BrokerInfo | None:
        try:
            data, stat = await self._call(self._kz().get_async(self._p(f"{BROKERS}/{node_id}"),
                                                               watch=self._data_watch))
        except NoNodeError:
            return None
        v = znodes.load(data)
        return BrokerInfo(node_id, str(v["host"]), int(v["port"]), v.get("rack"), stat.czxid)

    async def _read_broker(self, node_id: int) -> None:
        info = await self._get_broker(node_id)
        if info is None:
            self.image.remove_broker(node_id)
            self.registration.removed(node_id)
        else:
            self.image.apply_broker(info)

    async def _read_controller(self) -> None:
        path = self._p(CONTROLLER)
        stat = await self._call(self._kz().exists_async(path, watch=self._data_watch))
        if stat is None:
            self.image.apply_controller(NO_CONTROLLER, self.image.controller_epoch)
            return
        try:
            data, _ = await self._call(self._kz().get_async(path, watch=self._data_watch))
        except NoNodeError:
            self.image.apply_controller(NO_CONTROLLER, self.image.controller_epoch)
            return
        v = znodes.load(data)
        self.image.apply_controller(int(v["broker_id"]), int(v["controller_epoch"]))

    async def _read_topics(self, full: bool = False) -> None:
        names = await self._call(self._kz().get_children_async(self._p(TOPICS), watch=self._child_watch))
        self.image.retain_topics(names)
        todo = names if full else [n for n in names if n not in self.image.topics]
        await asyncio.gather(*(self._read_topic(n, full=True) for n in todo))

    async def _read_topic(self, name: str, full: bool = False) -> TopicInfo | None:
        """Read a topic znode; then the states not yet held (all of them with `full`) and, with `full`, its
        configs. With `full` the topic, its configs and its states enter the image as one delta: a listener never
        sees a new topic before its config overrides (a replica opened with the defaults of a topic created with
        `cleanup.policy=compact` or a short `retention.ms` would act on the wrong config meanwhile)."""
        held = self.image.topics.get(name)
        try:
            data, stat = await self._call(self._kz().get_async(self._p(self.topic_path(name)),
                                                               watch=self._data_watch))
        except NoNodeError:
            self.pending_creations.discard(name)
            self.image.remove_topic(name, held.created if held is not None else None)
            return None
        if znodes.creating(data):
            self.pending_creations.add(name)  # being created in steps: not a topic yet (its watch tells when)
            return None
        self.pending_creations.discard(name)
        info = znodes.topic_from(name, data, stat)
        if full or held is None or held.created != info.created:     # a new topic or a new incarnation
            partitions = list(info.assignment)
            configs, *states = await asyncio.gather(self._get_configs(name),
                                                    *(self._get_state(name, p) for p in partitions))
            with self.image.batch():
                self.image.apply_topic(info)
                if name in self.image.topics:
                    if configs is not None:
                        self.image.apply_topic_configs(name, *configs)
                    for p, state in zip(partitions, states, strict=True):
                        if state is not None:
                            self.image.apply_partition_state(name, p, *state)
            return self.image.topics.get(name)
        self.image.apply_topic(info)
        current = self.image.topics.get(name)
        if current is None:
            return None
        await asyncio.gather(*(self._read_state(name, p) for p in current.assignment
                               if (name, p) not in self.image.states))
        return self.image.topics.get(name)

    async def _get_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        """A partition state znode as (state, czxid), watched; None once it is gone."""
        try:
            data, stat = await self._call(self._kz().get_async(self._p(self.state_path(topic, partition)),
                                                               watch=self._data_watch))
        except NoNodeError:
            return None                  # the topic is going: its znode watch removes it
        return znodes.state_from(data, stat), stat.czxid

    async def _read_state(self, topic: str, partition: int) -> None:
        got = await self._get_state(topic, partition)
        if got is not None:
            self.image.apply_partition_state(topic, partition, *got)

    async def _get_configs(self, topic: str) -> tuple[dict[str, str], int, int] | None:
        """A topic's config znode as (overrides, version, czxid), watched; None once it is gone."""
        try:
            data, stat = await self._call(self._kz().get_async(self._p(f"{TOPIC_CONFIGS}/{topic}"),
                                                               watch=self._data_watch))
        except NoNodeError:
            return None
        configs = {str(k): str(v) for k, v in znodes.load(data).get("config", {}).items()}
        return configs, stat.version, stat.czxid

    async def _read_configs(self, topic: str) -> None:
        got = await self._get_configs(topic)
        if got is not None:
            self.image.apply_topic_configs(topic, *got)

    def config_version(self, topic: str) -> int | None:
        """The version of the topic's config znode as the image holds it (the CAS token for set_topic_configs)."""
        return self.image.config_version(topic)

    async def _read_deletions(self) -> None:
        names = await self._call(self._kz().get_children_async(self._p(DELETING), watch=self._child_watch))
        self.image.retain_deletions(names)
        await asyncio.gather(*(self._read_deletion(n) for n in names))

    async def _read_deletion(self, name: str) -> None:
        try:
            data, stat = await self._call(self._kz().get_async(self._p(f"{DELETING}/{name}"),
                                                               watch=self._data_watch))
        except NoNodeError:
            self.image.remove_deletion(name)
            return
        self.image.apply_deletion(znodes.deletion_from(name, data, stat))

    # ---- watches ---------------------------------------------------------------------------------------------

    def _on_watch(self, event: Any) -> None:         # kazoo's thread
        self._hop(event, children=False)

    def _on_child_watch(self, event: Any) -> None:   # kazoo's thread
        self._hop(event, children=True)

    def _hop(self, event: Any, children: bool) -> None:
        if event.type == EventType.NONE or not event.path:
            return                    # watches dropped by a disconnect: the reconnect re-reads everything
        try:
            self.loop.call_soon_threadsafe(self._dispatch, event.path, children)
        except RuntimeError:
            pass

    def _dispatch(self, path: str, children: bool) -> None:
        if self.session.closing or not path.startswith(self.root):
            return
        rel = path[len(self.root):]
        parts = rel.strip("/").split("/")
        read: Callable[[], Awaitable[Any]] | None = None
        if rel == BROKERS:
            read = self._read_brokers
        elif rel.startswith(BROKERS + "/") and len(parts) == 3 and parts[2].isdigit():
            read = functools.partial(self._read_broker, int(parts[2]))
        elif rel == CONTROLLER:
            read = self._read_controller
        elif rel == TOPICS:
            read = self._read_topics
        elif parts[0] == "topics" and len(parts) == 2:
            read = functools.partial(self._read_topic, parts[1])
        elif parts[0] == "topics" and len(parts) == 5 and parts[4] == "state" and parts[3].isdigit():
            read = functools.partial(self._read_state, parts[1], int(parts[3]))
        elif rel.startswith(TOPIC_CONFIGS + "/") and len(parts) == 3:
            read = functools.partial(self._read_configs, parts[2])
        elif rel == DELETING:
            read = self._read_deletions
        elif parts[0] == "deleting" and len(parts) == 2:
            read = functools.partial(self._read_deletion, parts[1])
        if read is not None:
            self.session.spawn(read, rel)

    # ---- helpers for tests and tools -------------------------------------------------------------------------

    async def dump(self, rel: str = "") -> dict[str, Any]:
        """The JSON value of a znode (for tests and `oncelog` diagnostics)."""
        data, _ = await self._call(self._kz().get_async(self._p(rel)))
        return znodes.load(data)

    async def stat(self, rel: str) -> Any:
        """A znode's ZooKeeper stat (versions, zxids: which transaction wrote it), for tests and diagnostics."""
        _, stat = await self._call(self._kz().get_async(self._p(rel)))
        return stat

    async def children(self, rel: str) -> list[str]:
        return list(await self._call(self._kz().get_children_async(self._p(rel))))
