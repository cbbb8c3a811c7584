"""The controller: one per broker, active only while this broker holds /controller (docs/cluster.md §5).

It decides leaders and ISRs when brokers come and go, and carries out the admin requests that change topics.
Decisions are made from the metadata image, which every broker already holds (so a failover loads nothing),
by the pure functions of elections.py and topic_plans.py, and written through the metadata store with this
controller's epoch: a deposed controller's writes fail as a unit and it steps down; a lost compare-and-set (a
leader's ISR write, a change seen late) re-reads the partition and decides again.

Reconciliation is level-triggered: after a change of the live brokers, or of a partition, the controller
compares each partition with what it should be (a live leader from the ISR, no dead broker in the ISR) and
writes the difference, so a missed event, a failover between two events or a restarted controller converge the
same way. Work runs one job at a time on one asyncio task, as on Kafka's controller event thread: admin requests
and reconciliations never interleave their decisions.

Leader balance: every leader.imbalance.check.interval.seconds, a few seconds after this controller takes the seat
(as Kafka's) and a few seconds after a broker registers or restarts (not in Kafka's ZooKeeper controller, see
_rebalance_loop), leaderships go back to preferred replicas by leader_balance.py's rule, through the same
compare-and-set as ElectLeaders.

Not decided here: ISR additions (the leader makes them, §4.5). An ISR change that completes a reassignment is
seen by watch and finishes it here.

Every admin method answers with Kafka error codes per topic or partition; NOT_CONTROLLER when this broker is not
(or stops being) the controller, so a forwarding broker retries with the new one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, TypeVar

from oncelog.config import ConfigError, parse_topic_overrides
from oncelog.errors import ErrorCode

from .crash_probe import CrashProbe
from .elections import (
    cancel_reassignment,
    complete_reassignment,
    desired_state,
    preferred_election,
    shutdown_change,
    start_reassignment,
    unclean_election,
)
from .leader_balance import RebalancePlan, plan_rebalance
from .metadata_image import NO_CONTROLLER, ImageDelta, MetadataImage, PartitionAssignment, PartitionState
from .metadata_store import (
    MetadataStore,
    NotController,
    RequestTooLarge,
    StaleVersion,
    StoreUnavailable,
    TopicExists,
    UnknownTopic,
)
from .placement import PlacementError, validate_replicas
from .topic_plans import NewTopic, TopicPlan, plan_new_partitions, plan_new_topic

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 10          # re-read-and-decide rounds before a change is left to the next reconciliation
WRITE_CONCURRENCY = 64     # partition writes in flight at once (each one ZooKeeper round trip)
SETTLE_BATCH = 500         # partition states per multi-op when the controller settles many at once (~80 KB)
PROBE_INTERVAL_KEY = "oncelog.controller.broker.probe.interval.ms"
STOP_TIMEOUT_S = 10.0      # for the controller's own tasks to end once cancelled
# Leader balance outside the periodic check (see _rebalance_loop): the first check this long after a broker
# registers or restarts, or after this controller takes the seat (Kafka's ZooKeeper controller waits 5 s after a
# failover), and again as often while a returning broker's preferred partitions wait for it to rejoin their ISR,
# for at most REBALANCE_FOLLOW_UP_S after the last registration; later the periodic check takes over.
REBALANCE_AFTER_REGISTRATION_S = 5.0
REBALANCE_FOLLOW_UP_S = 60.0

T = TypeVar("T")
TopicPartition = tuple[str, int]

UNKNOWN_PARTITION = "This server does not host this topic-partition."
TOO_LARGE = "Unable to perform excessively large batch operation."   # Kafka's answer to an oversized operation
NOT_CONTROLLER = "This is not the correct controller for this cluster."


class ElectionType(IntEnum):
    PREFERRED = 0
    UNCLEAN = 1


@dataclass(frozen=True)
class TopicResult:
    """The answer for one topic: Kafka's error code and message, and what was created."""

    code: ErrorCode = ErrorCode.NONE
    message: str | None = None
    topic_id: bytes | None = None
    num_partitions: int = -1
    replication_factor: int = -1


@dataclass(frozen=True)
class PartitionResult:
    code: ErrorCode = ErrorCode.NONE
    message: str | None = None


@dataclass(frozen=True)
class ShutdownResult:
    """ControlledShutdown's answer: the partitions the broker still leads (no other in-sync replica to take them)."""

    code: ErrorCode
    remaining: list[TopicPartition] = field(default_factory=list)


class _SteppedDown(Exception):
    """Inside a job: this broker is not (or no longer) the controller."""


def _election_message(code: ErrorCode, topic: str, p: int, election_type: ElectionType) -> str | None:
    if code == ErrorCode.ELECTION_NOT_NEEDED:
        return "Leader election not needed for topic partition."
    if code in (ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE):
        strategy = ("PreferredReplicaPartitionLeaderElectionStrategy" if election_type == ElectionType.PREFERRED
                    else "UncleanLeaderElectionStrategy")
        return f"Failed to elect leader for partition {topic}-{p} under strategy {strategy}"
    return None


class Controller:
    """Runs on every broker (start it after the broker registered); acts while this broker holds /controller."""

    def __init__(self, node_id: int, store: MetadataStore, image: MetadataImage, config: Any) -> None:
        self.node_id = node_id
        self.store = store
        self.image = image
        self.config = config
        self.is_active = False
        self.epoch: int | None = None
        self._queue: asyncio.Queue[tuple[Callable[[], Awaitable[Any]], asyncio.Future]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._known_epochs: dict[int, int] = {}
        self._shutting_down: dict[int, int] = {}        # node id -> the broker epoch that asked
        self._dirty: set[TopicPartition] = set()
        self._reconcile_all = False
        self._reconcile_queued = False
        self._election_queued = False
        self._stopped = False
        self._early_rebalance_at: float | None = None   # loop time of the next check outside the periodic one
        self._last_registration: float | None = None    # loop time a broker last registered or restarted
        self._rebalance_wake = asyncio.Event()

    # ---- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._known_epochs = {n: b.epoch for n, b in self.image.brokers.items()}
        self.image.subscribe(self._on_delta)
        self.store.on_state_change(self._on_store_state)
        self.store.on_seat_state_change(self._on_store_state)
        probe = CrashProbe(self.node_id, self.image, int(self._config(PROBE_INTERVAL_KEY, 0)), self._expire_broker,
                           lambda: self.is_active)
        self._tasks = [loop.create_task(self._run()), loop.create_task(self._rebalance_loop()),
                       loop.create_task(probe.run())]
        self._queue_election()

    async def stop(self) -> None:
        """Stop acting and give the seat up if held, so another broker takes over without waiting for the
        session timeout."""
        self._stopped = True
        self.image.unsubscribe(self._on_delta)
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(_SteppedDown())
        held = self.store.controller_epoch
        if held is not None and self.store.controller_usable:   # else closing the sessions ends the seat anyway
            try:
                await self.store.resign_controller(held)
            except Exception:
                log.exception("giving up the controller seat failed")
        self.is_active = False

    async def _run(self) -> None:
        while not self._stopped:
            job, future = await self._queue.get()
            if future.done():
                continue
            try:
                result = await job()
            except asyncio.CancelledError:
                future.cancel()
                raise
            except BaseException as exc:   # noqa: BLE001 - handed to whoever awaits the job
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(result)

    def _submit(self, job: Callable[[], Awaitable[T]]) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((job, future))
        return future

    def _background(self, job: Callable[[], Awaitable[Any]]) -> None:
        self._submit(job).add_done_callback(_log_failure)

    # ---- events ----------------------------------------------------------------------------------------------

    def _on_store_state(self, state: str) -> None:
        """A change of either session: the broker's (registration, writes, watches) or the seat's. The controller
        acts only while both are CONNECTED; it resumes after a reconnection if the seat is still its own."""
        if self._stopped:
            return
        if not self.store.controller_usable:
            if self.is_active:
                log.warning("controller %d (epoch %s) stops acting: ZooKeeper session %s, seat session %s",
                            self.node_id, self.epoch, self.store.state, self.store.seat_state)
            self.is_active = False
            if self.store.controller_epoch is None:
                self.epoch = None
            return
        self._queue_election()

    def _on_delta(self, delta: ImageDelta) -> None:
        if self._stopped:
            return
        if delta.controller_changed:
            if self.epoch is not None and (self.image.controller_epoch > self.epoch
                                           or self.store.controller_epoch != self.epoch):
                self._step_down("another controller was elected")
            if self.image.controller_id == NO_CONTROLLER:
                self._queue_election()
        if not self.is_active:
            return                          # whoever is elected next reconciles everything anyway
        if delta.brokers_changed:
            self._reconcile_all = True
        self._dirty |= delta.partitions
        if delta.brokers_changed or delta.partitions:
            self._queue_reconcile()

    def _queue_election(self) -> None:
        if not self._election_queued and not self._stopped:
            self._election_queued = True
            self._background(self._elect)

    def _queue_reconcile(self) -> None:
        if not self._reconcile_queued:
            self._reconcile_queued = True
            self._background(self._reconcile)

    def _step_down(self, why: str) -> None:
        if self.epoch is not None:
            log.info("controller %d steps down (epoch %d): %s", self.node_id, self.epoch, why)
        self.is_active = False
        self.epoch = None

    async def _expire_broker(self, node_id: int, broker_epoch: int) -> bool:
        """The crash probe found broker `node_id`'s port refusing connections: its registration goes, fenced by this
        controller's epoch, and the watches then handle the death as a session expiry."""
        epoch = self.epoch
        if not self.is_active or epoch is None:
            return False
        try:
            return await self.store.expire_registration(node_id, broker_epoch, epoch)
        except NotController:
            self._step_down("the controller epoch moved on")
        except StoreUnavailable:
            pass
        return False

    # ---- election --------------------------------------------------------------------------------------------

    async def _elect(self) -> None:
        self._election_queued = False
        if self._stopped or not self.store.controller_usable or self.store.broker_epoch is None:
            return
        held = self.store.controller_epoch
        if held is not None:                      # still ours: the seat session survived a disconnection
            if self.image.controller_epoch > held:
                self._step_down("a newer controller epoch is registered")
                return
            if self.is_active:
                return
            # Resuming: only if /controller is still the seat session's and /controller_epoch still the one set.
            if await self.store.seat_still_held():
                if self._stopped or not self.store.controller_usable or self.store.controller_epoch != held:
                    return
                self.epoch, self.is_active = held, True
                log.info("controller %d resumes at epoch %d", self.node_id, held)
                await self._on_elected()
                return
            self._step_down("the controller seat is no longer this broker's")     # and may run for it again
        if self.image.controller_id == self.node_id:
            # Named controller while holding no seat: a seat this broker's seat session still owns (its
            # registration was lost, or an election's answer was lost) is freed; the deletion's watch elects anew.
            await self.store.release_seat()
            return
        if self.image.controller_id != NO_CONTROLLER:
            return
        epoch = await self.store.try_become_controller(self.node_id, self.store.broker_epoch)
        if epoch is not None:
            self.epoch, self.is_active = epoch, True
            await self._on_elected()

    async def _on_elected(self) -> None:
        """A new controller has nothing to load (§5.3): it re-reads the live brokers, fixes every partition whose
        leader is gone and finishes reassignments that became ready while nobody was controller."""
        await self.store.refresh_brokers()
        self._known_epochs = {n: b.epoch for n, b in self.image.brokers.items()}
        self._shutting_down = {n: e for n, e in self._shutting_down.items() if self.image.broker_epoch(n) == e}
        self._reconcile_all = True
        # Brokers may have registered while nobody was controller (a whole cluster starting): treat the seat as a
        # registration, so the follow-up checks wait for them as well.
        self._last_registration = asyncio.get_running_loop().time()
        self._schedule_rebalance_check()
        await self._reconcile()
        try:
            abandoned = await self._fenced(self.store.abandon_creations(self.epoch))
        except (StoreUnavailable, _SteppedDown):
            return
        if abandoned:
            log.info("controller %d: removed topics a previous controller did not finish creating: %s",
                     self.node_id, abandoned)

    # ---- reconciliation: broker deaths, returns and restarts -------------------------------------------------

    async def _reconcile(self) -> None:
        self._reconcile_queued = False
        if not self.is_active:
            return
        bounced: set[int] = set()
        if self._reconcile_all:
            current = {n: b.epoch for n, b in self.image.brokers.items()}
            bounced = {n for n, e in current.items() if self._known_epochs.get(n, e) != e}
            gone = set(self._known_epochs) - set(current)
            if bounced or set(current) - set(self._known_epochs):     # a broker (re)registered
                self._last_registration = asyncio.get_running_loop().time()
                self._schedule_rebalance_check()
            for n in gone | bounced:
                self._shutting_down.pop(n, None)
            if gone or bounced:
                log.info("controller %d: brokers gone %s, restarted %s", self.node_id, sorted(gone), sorted(bounced))
            self._known_epochs = current
            keys = [(t, p) for t, p, _, _ in self.image.all_partitions()]
        else:
            keys = sorted(k for k in self._dirty if k in self.image.states)
        self._reconcile_all, self._dirty = False, set()
        try:
            if bounced:
                # The old incarnation of a restarted broker is dead: its leaderships move and it leaves the ISRs as
                # after a death; the new incarnation rejoins by catching up.
                live = set(self.image.brokers) - bounced
                await self._settle_all([k for k in keys if self._involves(k, bounced)], live)
            await self._settle_all(keys, None)
            await self._complete_ready(keys)
        except _SteppedDown:
            pass

    def _involves(self, key: TopicPartition, nodes: set[int]) -> bool:
        state = self.image.states.get(key)
        return state is not None and (state.leader in nodes or bool(nodes & set(state.isr)))

    async def _settle_all(self, keys: Sequence[TopicPartition], live: set[int] | None) -> None:
        """Decide every partition from the image and write the changes SETTLE_BATCH at a time, each batch one
        multi-op (one ZooKeeper transaction instead of one per partition: a broker's death moves thousands of
        leaderships in a few round trips). A batch whose compare-and-set fails (a leader's ISR write raced it)
        is decided and written again one partition at a time."""
        brokers = self.image.brokers if live is None else live
        changes: list[tuple[str, int, PartitionState, PartitionState]] = []
        for topic, p in keys:
            a, s = self.image.assignment(topic, p), self.image.partition(topic, p)
            if a is None or s is None:
                continue
            new = desired_state(a, s, brokers, self._shutting_down, self._unclean(topic))
            if new is not None:
                changes.append((topic, p, new, s))
        for start in range(0, len(changes), SETTLE_BATCH):
            batch = changes[start:start + SETTLE_BATCH]
            self._require_active()
            try:
                await self._fenced(self.store.write_partition_states(
                    [(t, p, new, old.version) for t, p, new, old in batch], self.epoch))
            except (StaleVersion, RequestTooLarge):
                await self._for_each([(t, p) for t, p, _, _ in batch], lambda k: self._settle(k, live))
                continue
            except StoreUnavailable as exc:
                log.warning("controller %d: %d partition states not written (%s); next reconciliation",
                            self.node_id, len(batch), exc)
                continue
            for t, p, new, old in batch:
                if new.leader != old.leader:
                    log.info("%s-%d: leader %d -> %d at leader epoch %d, ISR %s", t, p, old.leader, new.leader,
                             new.leader_epoch, list(new.isr))

    async def _settle(self, key: TopicPartition, live: set[int] | None) -> None:
        unclean = self._unclean(key[0])
        await self._cas(key, lambda a, s: desired_state(a, s, self.image.brokers if live is None else live,
                                                        self._shutting_down, unclean))

    def _unclean(self, topic: str) -> bool:
        override = self.image.topic_configs.get(topic, {}).get("unclean.leader.election.enable")
        if override is not None:
            return override.strip().lower() == "true"
        return bool(self._config("unclean.leader.election.enable", False))

    def _config(self, key: str, default: Any) -> Any:
        try:
            return self.config[key]
        except (KeyError, TypeError):
            return default

    async def _cas(self, key: TopicPartition,
                   decide: Callable[[PartitionAssignment, PartitionState], PartitionState | None]) -> bool:
        """Decide from the image and write with the version decided on; after a lost CAS re-read and decide
        again. Returns whether a write happened."""
        topic, p = key
        for _ in range(CAS_ATTEMPTS):
            self._require_active()
            a, s = self.image.assignment(topic, p), self.image.partition(topic, p)
            if a is None or s is None:
                return False
            new = decide(a, s)
            if new is None:
                return False
            try:
                await self._fenced(self.store.write_partition_state(topic, p, new, s.version, self.epoch))
            except StaleVersion:
                await self.store.read_partition_state(topic, p)
                continue
            if new.leader != s.leader:
                log.info("%s-%d: leader %d -> %d at leader epoch %d, ISR %s", topic, p, s.leader, new.leader,
                         new.leader_epoch, list(new.isr))
            return True
        log.warning("%s-%d: state kept changing; left to the next reconciliation", topic, p)
        return False

    async def _fenced(self, write: Awaitable[T]) -> T:
        """A controller write; a failed controller-epoch check means another controller: step down."""
        try:
            return await write
        except NotController:
            self._step_down("the controller epoch moved")
            raise _SteppedDown() from None

    async def _for_each(self, keys: Sequence[TopicPartition], work: Callable[[TopicPartition], Awaitable[T]]
                        ) -> list[T | None]:
        """`work` for each partition, WRITE_CONCURRENCY at a time; None where the store was unavailable."""
        gate = asyncio.Semaphore(WRITE_CONCURRENCY)

        async def one(key: TopicPartition) -> T | None:
            async with gate:
                try:
                    return await work(key)
                except StoreUnavailable as exc:
                    log.warning("%s-%d: %s", key[0], key[1], exc)
                    return None

        results = await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)
        for r in results:
            if isinstance(r, _SteppedDown):
                raise r
        for r in results:
            if isinstance(r, BaseException):
                log.error("controller write failed", exc_info=r)
        return [None if isinstance(r, BaseException) else r for r in results]

    def _usable(self) -> list[int]:
        return sorted(n for n in self.image.brokers if n not in self._shutting_down)

    # ---- topics ----------------------------------------------------------------------------------------------

    async def create_topics(self, topics: Sequence[NewTopic], validate_only: bool = False) -> dict[str, TopicResult]:
        """CreateTopics: each topic placed over the live brokers (or as assigned) and created in one multi-op."""
        async def job() -> dict[str, TopicResult]:
            names = [t.name for t in topics]
            out = {}
            for topic in topics:
                if names.count(topic.name) > 1:
                    out[topic.name] = TopicResult(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
                else:
                    out[topic.name] = await self._create_topic(topic, validate_only)
            return out

        return await self._answer(job, {t.name: TopicResult(ErrorCode.NOT_CONTROLLER, NOT_CONTROLLER) for t in topics})

    async def _create_topic(self, topic: NewTopic, validate_only: bool) -> TopicResult:
        self._require_active()
        try:
            plan = plan_new_topic(topic, self.image.brokers, self._usable(), self.image.topics,
                                  int(self._config("num.partitions", 1)),
                                  int(self._config("default.replication.factor", 1)))
        except PlacementError as exc:
            return TopicResult(exc.code, exc.message)
        count, rf = len(plan.assignment), plan.replication_factor
        if validate_only:
            return TopicResult(ErrorCode.NONE, None, None, count, rf)
        topic_id = uuid.uuid4().bytes
        try:
            await self._fenced(self.store.create_topic(topic.name, topic_id, plan.assignment, dict(topic.configs),
                                                       self.epoch, plan.initial))
        except TopicExists as exc:
            return TopicResult(ErrorCode.TOPIC_ALREADY_EXISTS, str(exc))
        except RequestTooLarge as exc:
            log.warning("topic %s not created: %s", topic.name, exc)
            return TopicResult(ErrorCode.POLICY_VIOLATION, TOO_LARGE)
        log.info("created topic %s: %d partition(s), replication factor %d", topic.name, count, rf)
        return TopicResult(ErrorCode.NONE, None, topic_id, count, rf)

    async def delete_topics(self, names: Sequence[str]) -> dict[str, TopicResult]:
        """DeleteTopics: the topic's znodes go in one multi-op, and /deleting/<topic> lists its replicas."""
        async def job() -> dict[str, TopicResult]:
            return {name: await self._delete_topic(name) for name in names}

        return await self._answer(job, {n: TopicResult(ErrorCode.NOT_CONTROLLER, NOT_CONTROLLER) for n in names})

    async def _delete_topic(self, name: str) -> TopicResult:
        self._require_active()
        if not self._config("delete.topic.enable", True):
            return TopicResult(ErrorCode.TOPIC_DELETION_DISABLED, "Topic deletion is disabled.")
        for _ in range(CAS_ATTEMPTS):
            info = self.image.topics.get(name)
            if info is None:
                return TopicResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION)
            try:
                await self._fenced(self.store.delete_topic(name, self.epoch, info.version))
            except (StaleVersion, UnknownTopic):
                await self.store.read_topic(name)
                continue
            log.info("deleted topic %s", name)
            return TopicResult(ErrorCode.NONE, None, info.topic_id)
        return TopicResult(ErrorCode.REQUEST_TIMED_OUT, f"Topic {name} kept changing while being deleted.")

    async def create_partitions(self, requests: Mapping[str, tuple[int, Sequence[Sequence[int]] | None]],
                                validate_only: bool = False) -> dict[str, TopicResult]:
        """CreatePartitions: {topic: (new total count, replicas of each added partition, or None to place them)}."""
        async def job() -> dict[str, TopicResult]:
            return {name: await self._create_partitions(name, count, assignments, validate_only)
                    for name, (count, assignments) in requests.items()}

        return await self._answer(job, {n: TopicResult(ErrorCode.NOT_CONTROLLER, NOT_CONTROLLER) for n in requests})

    async def _create_partitions(self, name: str, count: int, assignments: Sequence[Sequence[int]] | None,
                                 validate_only: bool) -> TopicResult:
        for _ in range(CAS_ATTEMPTS):
            self._require_active()
            info = self.image.topics.get(name)
            if info is None:
                return TopicResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION)
            try:
                plan = plan_new_partitions(info, count, assignments, self.image.brokers, self._usable())
            except PlacementError as exc:
                return TopicResult(exc.code, exc.message)
            done = TopicResult(ErrorCode.NONE, None, info.topic_id, count, info.replication_factor)
            if validate_only:
                return done
            assignment = {**info.assignment, **{p: PartitionAssignment(tuple(r)) for p, r in plan.assignment.items()}}
            try:
                await self._fenced(self.store.write_assignment(name, assignment, info.version, self.epoch,
                                                               new_partitions=self._new_states(plan)))
            except StaleVersion:
                await self.store.read_topic(name)
                continue
            except RequestTooLarge as exc:
                log.warning("partitions of %s not added: %s", name, exc)
                return TopicResult(ErrorCode.POLICY_VIOLATION, TOO_LARGE)
            log.info("topic %s: %d -> %d partitions", name, info.partition_count, count)
            return done
        return TopicResult(ErrorCode.REQUEST_TIMED_OUT, f"Topic {name} kept changing.")

    def _new_states(self, plan: TopicPlan) -> dict[int, PartitionState]:
        assert self.epoch is not None
        return {p: PartitionState(leader, 0, tuple(isr), self.epoch, 0) for p, (leader, isr) in plan.initial.items()}

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str]) -> TopicResult:
        """Replace a topic's config overrides with `configs` (IncrementalAlterConfigs computes the new set)."""
        async def job() -> TopicResult:
            try:
                parse_topic_overrides(configs)
            except ConfigError as exc:
                return TopicResult(ErrorCode.INVALID_CONFIG, str(exc))
            for _ in range(CAS_ATTEMPTS):
                self._require_active()
                version = self.image.config_version(topic)
                if topic not in self.image.topics or version is None:
                    return TopicResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION)
                try:
                    await self._fenced(self.store.set_topic_configs(topic, configs, version, self.epoch))
                    return TopicResult()
                except StaleVersion:
                    await self.store.read_topic(topic)
            return TopicResult(ErrorCode.REQUEST_TIMED_OUT, f"Configs of {topic} kept changing.")

        return await self._answer(job, TopicResult(ErrorCode.NOT_CONTROLLER, NOT_CONTROLLER))

    # ---- leadership ------------------------------------------------------------------------------------------

    async def elect_leaders(self, partitions: Iterable[TopicPartition] | None = None,
                            election_type: ElectionType = ElectionType.PREFERRED
                            ) -> dict[TopicPartition, PartitionResult]:
        """ElectLeaders. PREFERRED: the first replica, if alive and in the ISR. UNCLEAN: for partitions without a
        live leader, an in-sync replica if one is alive, else any live one. None: every partition."""
        wanted = None if partitions is None else list(partitions)

        async def job() -> dict[TopicPartition, PartitionResult]:
            keys = wanted if wanted is not None else [(t, p) for t, p, _, _ in self.image.all_partitions()]
            results = await self._for_each(keys, lambda k: self._elect_one(k, election_type))
            return {k: r or PartitionResult(ErrorCode.REQUEST_TIMED_OUT) for k, r in zip(keys, results, strict=True)}

        return await self._answer(job, {k: PartitionResult(ErrorCode.NOT_CONTROLLER, NOT_CONTROLLER)
                                        for k in wanted or []})

    async def _elect_one(self, key: TopicPartition, election_type: ElectionType) -> PartitionResult:
        topic, p = key
        if self.image.partition(topic, p) is None:
            return PartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION)
        elect = preferred_election if election_type == ElectionType.PREFERRED else unclean_election
        outcome = [ErrorCode.NONE]

        def decide(a: PartitionAssignment, s: PartitionState) -> PartitionState | None:
            new, outcome[0] = elect(a, s, set(self.image.brokers), self._shutting_down)
            return new

        await self._cas(key, decide)
        return PartitionResult(outcome[0], _election_message(outcome[0], topic, p, election_type))

    async def rebalance_leaders(self) -> RebalancePlan:
        """One leader-balance check (Kafka's auto leader rebalance, rule in leader_balance.py): for every broker
        whose share of preferred leaderships led elsewhere is above leader.imbalance.per.broker.percentage, elect
        the preferred replica wherever it is alive, not shutting down and in the ISR. Each election is the
        ElectLeaders PREFERRED compare-and-set under this controller's epoch, decided again from the newest state,
        so a partition that changed since the plan is left as it now is. Returns the plan (an empty one when this
        broker is not the controller)."""
        async def job() -> RebalancePlan:
            self._require_active()
            percentage = int(self._config("leader.imbalance.per.broker.percentage", 10))
            plan = plan_rebalance((((t, p), a, s) for t, p, a, s in self.image.all_partitions()),
                                  set(self.image.brokers), set(self._shutting_down), percentage)
            if not plan.elect:
                return plan
            for b, group in plan.brokers.items():
                if group.elsewhere and group.above(percentage):
                    log.info("leader balance: broker %d leads %d of the %d partition(s) it is preferred for "
                             "(%.0f%% elsewhere > %d%%)", b, group.preferred - len(group.elsewhere), group.preferred,
                             group.percentage, percentage)
            results = await self._for_each(plan.elect, lambda k: self._elect_one(k, ElectionType.PREFERRED))
            moved = [k for k, r in zip(plan.elect, results, strict=True) if r and r.code == ErrorCode.NONE]
            log.info("leader balance moved %d of %d leadership(s) back to preferred replicas%s", len(moved),
                     len(plan.elect), f"; {len(plan.waiting)} wait for their preferred replica to rejoin the ISR"
                     if plan.waiting else "")
            return plan

        return await self._answer(job, RebalancePlan())

    def _schedule_rebalance_check(self) -> None:
        """A leader-balance check REBALANCE_AFTER_REGISTRATION_S from now, unless one is due sooner."""
        at = asyncio.get_running_loop().time() + REBALANCE_AFTER_REGISTRATION_S
        if self._early_rebalance_at is None or at < self._early_rebalance_at:
            self._early_rebalance_at = at
            self._rebalance_wake.set()

    async def _rebalance_loop(self) -> None:
        """Runs on every broker and checks only while this one is the active controller and
        auto.leader.rebalance.enable is true (read at each check, as is the interval).

        Kafka's ZooKeeper controller checks 5 s after it takes the seat and then every
        leader.imbalance.check.interval.seconds (300), and never because a broker started: a broker restarted in a
        rolling restart, or a whole development cluster started again, leads nothing for up to five minutes. Here
        a check also comes REBALANCE_AFTER_REGISTRATION_S after a broker registers or restarts, and again as often
        while a broker above the threshold still waits for its returning preferred replica to rejoin an ISR
        (catching up takes a fetch or more), for at most REBALANCE_FOLLOW_UP_S after the last registration. This
        deviation is deliberate (docs/cluster.md §5.2); KRaft's controller (up to 4.0) also ties its check to an event
        rather than to a fixed clock: one interval after a partition first loses its preferred leader."""
        loop = asyncio.get_running_loop()
        next_periodic = loop.time() + float(self._config("leader.imbalance.check.interval.seconds", 300))
        while not self._stopped:
            early = self._early_rebalance_at
            due = next_periodic if early is None else min(next_periodic, early)
            self._rebalance_wake.clear()
            try:
                async with asyncio.timeout(max(due - loop.time(), 0.0)):
                    await self._rebalance_wake.wait()
                continue                                  # a sooner check was scheduled: wait again
            except TimeoutError:
                pass
            now = loop.time()
            if now >= next_periodic:
                next_periodic = now + float(self._config("leader.imbalance.check.interval.seconds", 300))
            if early is not None and now >= early:
                self._early_rebalance_at = None
            if not self.is_active or not self._config("auto.leader.rebalance.enable", True):
                continue
            try:
                plan = await self.rebalance_leaders()
            except Exception:
                log.exception("leader balance check failed")
                continue
            since = None if self._last_registration is None else loop.time() - self._last_registration
            if plan.waiting and since is not None and since < REBALANCE_FOLLOW_UP_S:
                self._schedule_rebalance_check()

    async def controlled_shutdown(self, node_id: int, broker_epoch: int) -> ShutdownResult:
        """ControlledShutdown: move the broker's leaderships to other in-sync replicas, take it out of the ISRs
        it follows in (the last member stays), and answer the partitions it still leads. From now until it
        registers again it is never chosen to lead."""
        async def job() -> ShutdownResult:
            self._require_active()
            registered = self.image.broker_epoch(node_id)
            if registered is None:
                return ShutdownResult(ErrorCode.BROKER_NOT_AVAILABLE)
            if registered != broker_epoch:
                return ShutdownResult(ErrorCode.STALE_BROKER_EPOCH)
            self._shutting_down[node_id] = broker_epoch
            keys = [k for k, s in self.image.states.items() if s.leader == node_id or node_id in s.isr]
            await self._for_each(keys, lambda k: self._cas(
                k, lambda a, s: shutdown_change(a, s, node_id, set(self.image.brokers), self._shutting_down)))
            remaining = sorted(k for k, s in self.image.states.items() if s.leader == node_id)
            log.info("controlled shutdown of broker %d: %d leadership(s) remain", node_id, len(remaining))
            return ShutdownResult(ErrorCode.NONE, remaining)

        return await self._answer(job, ShutdownResult(ErrorCode.NOT_CONTROLLER))

    # ---- reassignment ----------------------------------------------------------------------------------------

    async def alter_reassignments(self, targets: Mapping[TopicPartition, Sequence[int] | None]
                                  ) -> dict[TopicPartition, PartitionResult]:
        """AlterPartitionReassignments: {partition: target replicas, or None to cancel}. The target is written into
        the topic znode as adding/removing (KIP-455); the move completes when the added replicas are in the ISR."""
        async def job() -> dict[TopicPartition, PartitionResult]:
            self._require_active()
            out: dict[TopicPartition, PartitionResult] = {}
            by_topic: dict[str, dict[int, Sequence[int] | None]] = {}
            for (topic, p), target in targets.items():
                a = self.image.assignment(topic, p)
                if a is None:
                    out[(topic, p)] = PartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION)
                    continue
                if target is None and not a.reassigning:
                    out[(topic, p)] = PartitionResult(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                                                      f"No ongoing reassignment for partition {topic}-{p}.")
                    continue
                if target is not None:
                    try:
                        validate_replicas(target, self.image.brokers, None)
                    except PlacementError as exc:
                        out[(topic, p)] = PartitionResult(exc.code, exc.message)
                        continue
                by_topic.setdefault(topic, {})[p] = target
            for topic, changes in by_topic.items():
                result = await self._write_reassignment(topic, changes)
                out.update({(topic, p): result for p in changes})
            await self._complete_ready([(t, p) for t, changes in by_topic.items() for p in changes])
            return out

        return await self._answer(job, {k: PartitionResult(ErrorCode.NOT_CONTROLLER, NOT_CONTROLLER)
                                        for k in targets})

    async def _write_reassignment(self, topic: str, changes: Mapping[int, Sequence[int] | None]) -> PartitionResult:
        for _ in range(CAS_ATTEMPTS):
            self._require_active()
            info = self.image.topics.get(topic)
            if info is None:
                return PartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION)
            assignment = dict(info.assignment)
            states: dict[int, tuple[PartitionState, int]] = {}
            for p, target in changes.items():
                a = assignment[p]
                if target is None or tuple(target) == a.original:
                    assignment[p], new = cancel_reassignment(a, self.image.partition(topic, p),
                                                             set(self.image.brokers), self._shutting_down)
                    if new is not None:
                        states[p] = (new, new.version)
                else:
                    assignment[p] = start_reassignment(a, target)
            try:
                await self._fenced(self.store.write_assignment(topic, assignment, info.version, self.epoch,
                                                               states=states))
            except StaleVersion:
                await self.store.read_topic(topic)
                continue
            log.info("topic %s: reassigning %s", topic, {p: list(assignment[p].replicas) for p in changes})
            return PartitionResult()
        return PartitionResult(ErrorCode.REQUEST_TIMED_OUT, f"Topic {topic} kept changing.")

    async def complete_reassignments(self, partitions: Iterable[TopicPartition] | None = None
                                     ) -> list[TopicPartition]:
        """The completion step: every reassignment whose added replicas are all in the ISR drops the removed
        replicas (moving the leadership first if its leader goes). Runs by itself on each ISR change; callable
        directly. Returns the partitions completed."""
        wanted = None if partitions is None else list(partitions)

        async def job() -> list[TopicPartition]:
            self._require_active()
            return await self._complete_ready(wanted if wanted is not None
                                              else [(t, p) for t, p, _, _ in self.image.all_partitions()])

        return await self._answer(job, [])

    async def _complete_ready(self, keys: Iterable[TopicPartition]) -> list[TopicPartition]:
        topics = sorted({t for t, p in keys if (a := self.image.assignment(t, p)) is not None and a.reassigning})
        done: list[TopicPartition] = []
        for topic in topics:
            done += await self._complete_topic(topic, [p for t, p in keys if t == topic])
        return done

    async def _complete_topic(self, topic: str, parts: list[int]) -> list[TopicPartition]:
        for _ in range(CAS_ATTEMPTS):
            self._require_active()
            info = self.image.topics.get(topic)
            if info is None:
                return []
            assignment = dict(info.assignment)
            states: dict[int, tuple[PartitionState, int]] = {}
            completed = []
            for p in parts:
                s = self.image.partition(topic, p)
                ready = None if s is None or p not in assignment else complete_reassignment(
                    assignment[p], s, set(self.image.brokers), self._shutting_down)
                if ready is None:
                    continue
                assignment[p], new = ready
                if new is not None:
                    states[p] = (new, new.version)
                completed.append(p)
            if not completed:
                return []
            try:
                await self._fenced(self.store.write_assignment(topic, assignment, info.version, self.epoch,
                                                               states=states))
            except StaleVersion:
                await self.store.read_topic(topic)
                for p in completed:
                    await self.store.read_partition_state(topic, p)
                continue
            log.info("topic %s: reassignment of partition(s) %s completed", topic, completed)
            return [(topic, p) for p in completed]
        return []

    # ---- plumbing --------------------------------------------------------------------------------------------

    def _require_active(self) -> None:
        if not self.is_active or self.epoch is None or not self.store.controller_usable:
            raise _SteppedDown()

    async def _answer(self, job: Callable[[], Awaitable[T]], not_controller: T) -> T:
        """Run an admin job on the controller's queue; `not_controller` if this broker is not (or stops being)
        the controller or loses its session meanwhile."""
        if not self.is_active or self._stopped:
            return not_controller
        try:
            return await self._submit(job)
        except (_SteppedDown, StoreUnavailable):
            return not_controller


def _log_failure(future: asyncio.Future) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None and not isinstance(exc, (_SteppedDown, StoreUnavailable)):
        log.error("controller job failed", exc_info=exc)
