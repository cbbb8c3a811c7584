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
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
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
        self.cluster_id = ""
        self.fatal_error: BaseException | None = None
        # Topics whose znode says `creating` (created in steps by a controller, not visible yet).
        self.pending_creations: set[str] = set()
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

    # ---- controller writes -----------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        topic_id: bytes,
        assignment: Mapping[int, Sequence[int]],
        configs: Mapping[str, str],
        controller_epoch: int,
        initial: Mapping[int, tuple[int, Sequence[int]]] | None = None,
    ) -> TopicInfo:
        """One multi-op: the controller-epoch check, the topic znode, every partition's state znode (leader =
        first replica, epoch 0, ISR = all replicas, unless `initial` gives {partition: (leader, isr)}) and the
        config znode. Raises TopicExists. Returns the topic as the image now holds it."""
        self._require_connected()
        parts = {p: PartitionAssignment(tuple(r)) for p, r in sorted(assignment.items())}

        def build(txn: Any) -> None:
            txn.create(self._p(self.topic_path(name)), znodes.topic_json(topic_id, parts))
            txn.create(self._p(f"{self.topic_path(name)}/partitions"), b"")
            for p, a in parts.items():
                leader, isr = (initial or {}).get(p, (a.replicas[0], a.replicas))
                txn.create(self._p(f"{self.topic_path(name)}/partitions/{p}"), b"")
                txn.create(self._p(self.state_path(name, p)),
                           znodes.state_json(PartitionState(leader, 0, tuple(isr), controller_epoch, 0)))
            txn.create(self._p(f"{TOPIC_CONFIGS}/{name}"), znodes.dump({"config": dict(configs)}))

        try:
            try:
                await self._commit(build, controller_epoch)
            except RequestTooLarge:
                await self._create_in_steps(name, topic_id, parts, configs, controller_epoch, initial)
        except NodeExistsError as exc:
            raise TopicExists(f"Topic '{name}' already exists.") from exc
        info = await self._read_topic(name, full=True)
        if info is None:
            raise UnknownTopic(f"topic {name} vanished right after its creation")
        return info

    async def _create_in_steps(self, name: str, topic_id: bytes, parts: Mapping[int, PartitionAssignment],
                               configs: Mapping[str, str], controller_epoch: int,
                               initial: Mapping[int, tuple[int, Sequence[int]]] | None) -> None:
        """A topic too big for one ZooKeeper request (jute.maxbuffer): its znode first, marked `creating` (every
        image ignores it), then its partitions' znodes a batch per multi-op, then, atomically, the mark cleared
        and the config written: the topic appears whole or not at all. Every step carries the controller-epoch
        check; a creation a controller left unfinished is removed by the next one (`abandon_creations`)."""
        base = self._p(self.topic_path(name))

        def first(txn: Any) -> None:
            txn.create(base, znodes.topic_json(topic_id, parts, creating=True))
            txn.create(f"{base}/partitions", b"")

        await self._commit(first, controller_epoch)
        try:
            await self._create_partitions_then_reveal(name, topic_id, parts, configs, controller_epoch, initial)
        except BaseException:
            with contextlib.suppress(Exception):     # best effort; else the next controller removes it
                self.pending_creations.add(name)
                await self.abandon_creations(controller_epoch, only=name)
            raise

    async def _create_partitions_then_reveal(self, name: str, topic_id: bytes,
                                             parts: Mapping[int, PartitionAssignment], configs: Mapping[str, str],
                                             controller_epoch: int,
                                             initial: Mapping[int, tuple[int, Sequence[int]]] | None) -> None:
        base = self._p(self.topic_path(name))
        items = sorted(parts.items())
        # Two creates per partition: paths, a state of at most ~200 bytes, headers and ACLs; half the limit.
        batch = max(1, MAX_MULTI_BYTES // 2 // (2 * (len(base) + 96) + 200))
        for i in range(0, len(items), batch):
            def states(txn: Any, chunk: Sequence[tuple[int, PartitionAssignment]] = items[i:i + batch]) -> None:
                for p, a in chunk:
                    leader, isr = (initial or {}).get(p, (a.replicas[0], a.replicas))
                    txn.create(f"{base}/partitions/{p}", b"")
                    txn.create(f"{base}/partitions/{p}/state",
                               znodes.state_json(PartitionState(leader, 0, tuple(isr), controller_epoch, 0)))

            await self._commit(states, controller_epoch)

        def finish(txn: Any) -> None:
            txn.set_data(base, znodes.topic_json(topic_id, parts), version=0)
            txn.create(self._p(f"{TOPIC_CONFIGS}/{name}"), znodes.dump({"config": dict(configs)}))

        await self._commit(finish, controller_epoch)

    async def abandon_creations(self, controller_epoch: int, only: str | None = None) -> list[str]:
        """A new controller removes the topics a previous one began to create in steps and did not finish (never
        visible to anyone); their CreateTopics got no success answer, and a retry creates them anew. `only`: the
        creation this controller just failed to finish."""
        gone = []
        for name in sorted(self.pending_creations if only is None else {only}):
            base = self._p(self.topic_path(name))
            try:
                data, stat = await self._call(self._kz().get_async(base))
            except NoNodeError:
                self.pending_creations.discard(name)
                continue
            if not znodes.creating(data):
                continue
            await self._delete_partition_znodes(name, controller_epoch)
            try:
                await self._commit(lambda txn, b=base, v=stat.version: (txn.delete(f"{b}/partitions"),
                                                                         txn.delete(b, version=v)),
                                   controller_epoch)
            except (NoNodeError, BadVersionError, NotEmptyError):
                continue                  # changed meanwhile: looked at again by the next controller
            self.pending_creations.discard(name)
            gone.append(name)
        return gone

    async def write_partition_states(self, changes: Sequence[tuple[str, int, PartitionState, int]],
                                     controller_epoch: int) -> None:
        """The controller's CAS of many partition states at once, (topic, partition, new state, expected version)
        each, in one multi-op behind its epoch check: all are written or none (StaleVersion when any of them
        moved since it was read; the caller then decides those one by one). One ZooKeeper transaction, so one
        fsync on the ensemble, instead of one per partition: moving the leaderships of thousands of partitions
        after a broker's death takes a few round trips. Applies the states to the image."""
        self._require_connected()
        stamped = [(t, p, PartitionState(s.leader, s.leader_epoch, s.isr, controller_epoch, s.version,
                                         s.log_start_floor), v) for t, p, s, v in changes]

        def build(txn: Any) -> None:
            for topic, partition, state, version in stamped:
                txn.set_data(self._p(self.state_path(topic, partition)), znodes.state_json(state), version=version)

        try:
            results = await self._commit(build, controller_epoch)
        except (BadVersionError, NoNodeError) as exc:
            raise StaleVersion(f"one of {len(changes)} partition states moved") from exc
        stats = results[1:]
        with self.image.batch():
            for (topic, partition, state, _), stat in zip(stamped, stats, strict=True):
                self.image.apply_partition_state(topic, partition, _replace_version(state, stat.version),
                                                 stat.czxid)

    async def write_partition_state(self, topic: str, partition: int, new: PartitionState, expected_version: int,
                                    controller_epoch: int | None) -> int:
        """CAS of a partition's state on `expected_version`. The controller passes its epoch (checked in the same
        multi-op, and written into the state); a leader's ISR write passes None. Returns the new version and
        applies the state to the image. Raises StaleVersion or NotController."""
        self._require_connected()
        path = self._p(self.state_path(topic, partition))
        if controller_epoch is not None:
            new = PartitionState(new.leader, new.leader_epoch, new.isr, controller_epoch, new.version,
                                 new.log_start_floor)
        try:
            results = await self._commit(
                lambda txn: txn.set_data(path, znodes.state_json(new), version=expected_version), controller_epoch)
        except (BadVersionError, NoNodeError) as exc:
            raise StaleVersion(f"{topic}-{partition} state is no longer at version {expected_version}") from exc
        stat = results[-1]
        self.image.apply_partition_state(topic, partition, _replace_version(new, stat.version), stat.czxid)
        return stat.version

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
        """CAS of the topic znode (its whole assignment, with adding/removing), in one multi-op with the creation of
        `new_partitions` (CreatePartitions) and CASes of `states` {partition: (state, expected version)} (the end
        of a reassignment). Returns the topic znode's new version. Raises StaleVersion / NotController."""
        self._require_connected()
        held = self.image.topics.get(topic)
        if held is None:
            raise UnknownTopic(topic)
        parts = {p: znodes.as_assignment(a) for p, a in assignment.items()}
        new_partitions = dict(new_partitions or {})
        states = dict(states or {})
        if not set(new_partitions) <= set(parts) - set(held.assignment):
            raise ValueError(f"new partitions {sorted(new_partitions)} of {topic} must be in the assignment and new")

        def build(txn: Any) -> None:
            txn.set_data(self._p(self.topic_path(topic)), znodes.topic_json(held.topic_id, parts), version=expected_version)
            for p, state in sorted(new_partitions.items()):
                txn.create(self._p(f"{self.topic_path(topic)}/partitions/{p}"), b"")
                txn.create(self._p(self.state_path(topic, p)),
                           znodes.state_json(_with_epoch(state, controller_epoch)))
            for p, (state, version) in sorted(states.items()):
                txn.set_data(self._p(self.state_path(topic, p)),
                             znodes.state_json(_with_epoch(state, controller_epoch)), version=version)

        try:
            results = await self._commit(build, controller_epoch)
        except (BadVersionError, NoNodeError, NodeExistsError) as exc:
            raise StaleVersion(f"topic {topic} changed since version {expected_version}") from exc
        stat = results[1]
        self.image.apply_topic(TopicInfo(topic, held.topic_id, parts, stat.version, stat.czxid))
        offset = 2 + 2 * len(new_partitions)
        for i, (p, (state, _)) in enumerate(sorted(states.items())):
            s = results[offset + i]
            self.image.apply_partition_state(topic, p, _replace_version(_with_epoch(state, controller_epoch),
                                                                        s.version), s.czxid)
        if new_partitions:
            await asyncio.gather(*(self._read_state(topic, p) for p in new_partitions))
        return stat.version

    async def delete_topic(self, name: str, controller_epoch: int, expected_version: int | None = None) -> None:
        """One multi-op: the controller-epoch check, /deleting/<topic> (created, or its CAS) naming this topic id
        and its replicas, and the removal of the topic's znodes and config. Raises UnknownTopic / StaleVersion."""
        self._require_connected()
        held = self.image.topics.get(name)
        if held is None:
            raise UnknownTopic(name)
        replicas = sorted({r for a in held.assignment.values() for r in a.replicas})
        deletion = self.image.deleting.get(name)
        pending = dict(deletion.pending) if deletion is not None else {}
        pending[held.topic_id] = tuple(replicas)
        base = self._p(self.topic_path(name))

        def build(txn: Any, partitions: Sequence[int] | None = None) -> None:
            if deletion is None:
                txn.create(self._p(f"{DELETING}/{name}"), znodes.deletion_json(pending))
            else:
                txn.set_data(self._p(f"{DELETING}/{name}"), znodes.deletion_json(pending), version=deletion.version)
            for p in sorted(held.assignment) if partitions is None else partitions:
                txn.delete(f"{base}/partitions/{p}/state")
                txn.delete(f"{base}/partitions/{p}")
            txn.delete(f"{base}/partitions")
            txn.delete(base, version=held.version if expected_version is None else expected_version)
            txn.delete(self._p(f"{TOPIC_CONFIGS}/{name}"))

        try:
            try:
                await self._commit(build, controller_epoch)
            except RequestTooLarge:
                # Too many partitions for one request: their znodes go first, a batch per multi-op (each pair of
                # state and partition znode together, so any controller can resume from what is left), then the
                # topic znode with the rest, atomically.
                await self._delete_partition_znodes(name, controller_epoch)
                await self._commit(lambda txn: build(txn, partitions=()), controller_epoch)
        except NoNodeError as exc:
            await self._read_topic(name)
            raise StaleVersion(f"topic {name} changed while being deleted") from exc
        except (BadVersionError, NodeExistsError, NotEmptyError) as exc:
            raise StaleVersion(f"topic {name} changed while being deleted") from exc
        self.image.remove_topic(name, held.created)
        await self._read_deletion(name)

    async def _delete_partition_znodes(self, name: str, controller_epoch: int) -> None:
        base = self._p(f"{self.topic_path(name)}/partitions")
        left = sorted(int(p) for p in await self._call(self._kz().get_children_async(base)) if p.isdigit())
        batch = max(1, MAX_MULTI_BYTES // (4 * (len(base) + 32)))
        for i in range(0, len(left), batch):
            def build(txn: Any, chunk: Sequence[int] = left[i:i + batch]) -> None:
                for p in chunk:
                    txn.delete(f"{base}/{p}/state")
                    txn.delete(f"{base}/{p}")
            await self._commit(build, controller_epoch)

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], expected_version: int,
                                controller_epoch: int) -> int:
        """CAS of a topic's config overrides (the whole set). Returns the new version."""
        self._require_connected()
        path = self._p(f"{TOPIC_CONFIGS}/{topic}")
        try:
            results = await self._commit(
                lambda txn: txn.set_data(path, znodes.dump({"config": dict(configs)}), version=expected_version),
                controller_epoch)
        except (BadVersionError, NoNodeError) as exc:
            raise StaleVersion(f"configs of {topic} changed since version {expected_version}") from exc
        stat = results[-1]
        self.image.apply_topic_configs(topic, configs, stat.version, stat.czxid)
        return stat.version

    async def complete_topic_deletion(self, topic: str, topic_id: bytes, node_id: int) -> None:
        """A broker reports its copy of a deleted topic gone; the last one removes /deleting/<topic>."""
        self._require_connected()
        path = self._p(f"{DELETING}/{topic}")
        for _ in range(20):
            try:
                data, stat = await self._call(self._kz().get_async(path))
            except NoNodeError:
                return
            deletion = znodes.deletion_from(topic, data, stat)
            if node_id not in deletion.pending.get(topic_id, ()):
                return
            pending = dict(deletion.pending)
            pending[topic_id] = tuple(r for r in pending[topic_id] if r != node_id)
            pending = {t: r for t, r in pending.items() if r}
            try:
                if pending:
                    await self._call(self._kz().set_async(path, znodes.deletion_json(pending), version=stat.version))
                else:
                    await self._call(self._kz().delete_async(path, version=stat.version))
                await self._read_deletion(topic)
                return
            except (BadVersionError, NoNodeError):
                continue
        raise StaleVersion(f"/deleting/{topic} kept changing")

    async def allocate_producer_ids(self, node_id: int, block_size: int) -> tuple[int, int]:
        """Reserve the next `block_size` producer ids for this broker: a CAS on /latest_producer_id_block, which
        holds the end of the last block handed out (Kafka's ZooKeeper-era allocation), so ids are unique across
        the cluster and never reused, whatever happens to a broker's disk. Returns [start, end)."""
        self._require_connected()
        path = self._p(PRODUCER_ID_BLOCK)
        for _ in range(100):
            try:
                data, stat = await self._call(self._kz().get_async(path))
            except NoNodeError:
                try:
                    await self._call(self._kz().create_async(
                        path, znodes.dump({"broker": node_id, "block_start": 0, "block_end": block_size})))
                    return 0, block_size
                except NodeExistsError:
                    continue
            start = int(znodes.load(data)["block_end"])
            value = znodes.dump({"broker": node_id, "block_start": start, "block_end": start + block_size})
            try:
                await self._call(self._kz().set_async(path, value, version=stat.version))
                return start, start + block_size
            except BadVersionError:
                continue
        raise StaleVersion("/latest_producer_id_block kept changing")

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


def _replace_version(state: PartitionState, version: int) -> PartitionState:
    return PartitionState(state.leader, state.leader_epoch, state.isr, state.controller_epoch, version,
                          state.log_start_floor)


def _with_epoch(state: PartitionState, controller_epoch: int) -> PartitionState:
    return PartitionState(state.leader, state.leader_epoch, state.isr, controller_epoch, state.version,
                          state.log_start_floor)
