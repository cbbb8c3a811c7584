"""Group membership, classic protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup (eager rebalancing).

The member runs on the client's loop. What changes what the application consumes — giving
partitions up before a rejoin, taking the new assignment — is not done here but posted as a
`RebalanceEvent` that the application side serves in poll() (where confluent-kafka runs
on_revoke/on_assign too), and the member waits until it is served. So offsets are committed
and callbacks run on the application's thread, strictly before the partitions change hands.
A member whose application stops polling would hold its partitions forever (heartbeats run on
the loop), so after max.poll.interval.ms without progress it leaves the group, as the Java
client and librdkafka do, and rejoins when the application polls again.

The leader assigns with the first strategy in its JoinGroup answer's protocol name that we
know; the subscription bytes are Kafka's ConsumerProtocol, so librdkafka and Java members can
share the group and lead it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from oncelog.client.consumer.assignors import Member, assignor_for
from oncelog.client.consumer.protocol import (
    CONSUMER_PROTOCOL_TYPE,
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from oncelog.client.errors import FatalError, KafkaError, KafkaTimeoutError, RetriableError, error_for
from oncelog.client.types import ConsumerGroupMetadata
from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey

log = logging.getLogger(__name__)

TP = tuple[str, int]
GROUP_COORDINATOR = 0

_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})
_RESET_MEMBER = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION})


class RebalanceEvent:
    """Revoke, assign or lose `partitions`; for revoke and assign the member waits on `done` until the
    application side served the event ("lost": already taken away, nothing to wait for)."""

    __slots__ = ("kind", "partitions", "done", "_loop")

    def __init__(self, kind: str, partitions: list[TP], loop: asyncio.AbstractEventLoop) -> None:
        self.kind = kind  # "revoke" | "assign" | "lost"
        self.partitions = partitions
        self._loop = loop
        self.done: asyncio.Future = loop.create_future()

    def complete(self) -> None:
        """Mark served; callable from any thread."""
        def finish() -> None:
            if not self.done.done():
                self.done.set_result(None)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            finish()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(finish)


class GroupMember:
    def __init__(self, cluster: Any, config: Any, post_event: Callable[[RebalanceEvent], None],
                 post_error: Callable[[KafkaError], None], *, liveness: Callable[[], Any] | None = None,
                 drop_assignment: Callable[[], None] | None = None) -> None:
        self._cluster = cluster
        self.group_id: str = config["group.id"]
        self.group_instance_id: str | None = config["group.instance.id"]
        self._session_timeout_ms = config["session.timeout.ms"]
        self._rebalance_timeout_ms = config["max.poll.interval.ms"]
        self._heartbeat_interval = config["heartbeat.interval.ms"] / 1000
        self._request_timeout = config["request.timeout.ms"] / 1000
        self._backoff = config["retry.backoff.ms"] / 1000
        self._strategies = list(config["partition.assignment.strategy"])
        self._post_event = post_event
        self._post_error = post_error
        # max.poll.interval.ms: `liveness` returns a mark that changes whenever the application consumes,
        # or None while it waits inside poll(); a mark unchanged for longer means it stopped polling.
        self._liveness = liveness
        self._drop_assignment = drop_assignment
        self._max_poll_interval = config["max.poll.interval.ms"] / 1000
        self._progress_mark: Any = None
        self._progress_at = time.monotonic()
        self.member_id = ""
        self.generation_id = -1
        self.protocol_name: str | None = None
        self.leader_id = ""
        self.topics: list[str] = []  # what we subscribe to now: literal names plus the current pattern matches
        self._literal: list[str] = []
        self._patterns: list[re.Pattern[str]] = []
        self._pattern_check_every = config["metadata.max.age.ms"] / 1000
        self._patterns_checked = 0.0
        self.assigned: list[TP] = []
        self._rejoin = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._leader_counts: dict[str, int] | None = None  # partition counts the leader assigned with

    def metadata(self) -> ConsumerGroupMetadata:
        return ConsumerGroupMetadata(self.group_id, self.generation_id, self.member_id, self.group_instance_id)

    def subscribe(self, topics: list[str]) -> None:
        """Topic names; a name starting with "^" is a regular expression (confluent-kafka's convention),
        matched against the cluster's non-internal topics before every join and every metadata.max.age.ms."""
        self._literal = [t for t in topics if not t.startswith("^")]
        self._patterns = [re.compile(t) for t in topics if t.startswith("^")]
        self.topics = list(self._literal)
        self.request_rejoin()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="oncelog-group")

    def request_rejoin(self) -> None:
        self._rejoin.set()
        self._wake.set()

    async def unsubscribe(self) -> None:
        """Leave the group (the member stays usable for a later subscribe).

        The application side has already given the partitions up (commit, on_revoke) before
        calling this: it is the caller of unsubscribe(), so it cannot also serve an event.
        """
        await self._stop_task()
        self.assigned = []
        await self.leave()
        self.topics = []

    async def close(self) -> None:
        self._closing = True
        await self._stop_task()
        await self.leave()

    async def _stop_task(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- the membership loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                if self.generation_id >= 0 and self._application_stalled():
                    await self._leave_for_stalled_application()
                    continue
                if self._rejoin.is_set():
                    await self._rebalance()
                    continue
                await self._heartbeat_round()
            except asyncio.CancelledError:
                raise
            except FatalError as exc:
                log.error("group %s: %s", self.group_id, exc)
                self._lose_assignment()  # not a member any more: what it held is someone else's now
                self._post_error(exc)
                return
            except (RetriableError, KafkaTimeoutError) as exc:
                # Coordinator moving or unreachable: retry what failed (a heartbeat keeps the generation;
                # if the session expired meanwhile, the next heartbeat says UNKNOWN_MEMBER_ID).
                log.info("group %s: %s; retrying", self.group_id, exc)
                await asyncio.sleep(self._backoff)
            except KafkaError as exc:
                log.warning("group %s: %s; rejoining", self.group_id, exc)
                self._rejoin.set()
                await asyncio.sleep(self._backoff)

    async def _resolve_patterns(self) -> bool:
        """Re-match the patterns; True when the subscribed topics changed."""
        self._patterns_checked = time.monotonic()
        if not self._patterns:
            return False
        everything = await self._cluster.list_all_topics()
        matched = {name for name, meta in everything.items()
                   if not meta.is_internal and not name.startswith("__")
                   and any(p.match(name) for p in self._patterns)}
        topics = sorted(set(self._literal) | matched)
        if topics == sorted(self.topics):
            return False
        log.info("group %s: subscription patterns now match %s", self.group_id, topics)
        self.topics = topics
        return True

    async def _rebalance(self) -> None:
        await self._resolve_patterns()
        if self.assigned:  # eager protocol: everything is given up before joining
            revoked, self.assigned = self.assigned, []
            await self._hand_over("revoke", revoked)
        self._rejoin.clear()  # before the join: a request to rejoin that arrives during it must not be lost
        try:
            assignment = await self._join_and_sync()
        except BaseException:
            self._rejoin.set()
            raise
        if assignment is None:
            self._rejoin.set()
            await asyncio.sleep(self._backoff)
            return
        self.assigned = sorted((t, p) for t, ps in assignment.partitions.items() for p in ps if t in self.topics)
        await self._hand_over("assign", self.assigned)

    async def _hand_over(self, kind: str, partitions: list[TP]) -> None:
        event = RebalanceEvent(kind, list(partitions), asyncio.get_running_loop())
        self._post_event(event)
        # Heartbeats go on while the application serves the event, so a slow callback does not
        # cost the membership (up to max.poll.interval.ms, which the coordinator enforces).
        beats = asyncio.get_running_loop().create_task(self._heartbeats_until(event.done))
        try:
            await event.done
        finally:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)

    async def _heartbeats_until(self, done: asyncio.Future) -> None:
        while not done.done() and self.generation_id >= 0:
            await asyncio.sleep(self._heartbeat_interval)
            try:
                await self._heartbeat()
            except KafkaError as exc:
                log.info("group %s: heartbeat while rebalancing: %s", self.group_id, exc)

    def _application_stalled(self) -> bool:
        if self._liveness is None:
            return False
        mark = self._liveness()
        now = time.monotonic()
        if mark is None or mark != self._progress_mark:
            self._progress_mark = mark
            self._progress_at = now
            return False
        return now - self._progress_at > self._max_poll_interval

    def _lose_assignment(self) -> None:
        """Take the partitions away on the loop (their buffered data is not handed out any more) and
        tell the application side, which runs on_lost (or on_revoke) without committing."""
        lost, self.assigned = self.assigned, []
        if self._drop_assignment is not None:
            self._drop_assignment()
        if lost:
            self._post_event(RebalanceEvent("lost", lost, asyncio.get_running_loop()))

    async def _leave_for_stalled_application(self) -> None:
        """Java's and librdkafka's rule: a member whose application stopped polling leaves, so its
        partitions go to members that work; it rejoins when the application polls again."""
        log.warning("group %s: no poll() for more than max.poll.interval.ms (%d ms); leaving the group",
                    self.group_id, self._max_poll_interval * 1000)
        self._lose_assignment()
        self._post_error(KafkaError(
            f"the application did not call poll() for more than max.poll.interval.ms "
            f"({int(self._max_poll_interval * 1000)} ms): left group {self.group_id!r}, rejoining on the next poll"))
        await self.leave()
        mark = self._progress_mark
        while self._liveness is not None and self._liveness() == mark:
            await asyncio.sleep(self._heartbeat_interval)
        self._progress_mark = None
        self._progress_at = time.monotonic()
        self._rejoin.set()

    async def _heartbeat_round(self) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), self._heartbeat_interval)
        except TimeoutError:
            pass
        if self._rejoin.is_set():
            return
        await self._heartbeat()
        if self._patterns and time.monotonic() - self._patterns_checked >= self._pattern_check_every:
            if await self._resolve_patterns():
                self._rejoin.set()
                return
        if self._leader_counts is not None and self._partition_counts_changed():
            log.info("group %s: partition count of a subscribed topic changed; rebalancing", self.group_id)
            self._rejoin.set()

    def _partition_counts_changed(self) -> bool:
        assert self._leader_counts is not None
        for topic, count in self._leader_counts.items():
            parts = self._cluster.partitions_for(topic)
            if parts is not None and len(parts) != count:
                return True
        return False

    async def _heartbeat(self) -> None:
        conn = await self._cluster.coordinator(self.group_id, GROUP_COORDINATOR)
        version = conn.api_version(ApiKey.HEARTBEAT, 4, 0)
        resp = await conn.call(ApiKey.HEARTBEAT, {
            "group_id": self.group_id, "generation_id": self.generation_id, "member_id": self.member_id,
            "group_instance_id": self.group_instance_id}, version=version, timeout=self._request_timeout)
        code = resp.error_code
        if code == ErrorCode.NONE:
            return
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            self._rejoin.set()
            return
        if code in _RESET_MEMBER:
            self._reset_member()
            self._rejoin.set()
            return
        self._check_common(code, "Heartbeat")

    def _reset_member(self) -> None:
        self.member_id = ""
        self.generation_id = -1

    def _round_goes_on(self, code: int, api: str) -> bool:
        """A JoinGroup or SyncGroup answer: False when this round ends and a new one starts (the member was reset,
        or the group began rebalancing again); raises what _check_common raises; True when it succeeded."""
        if code in _RESET_MEMBER:
            self._reset_member()
            return False
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            return False
        if code:
            self._check_common(code, api)
        return True

    def _check_common(self, code: int, api: str) -> None:
        if code in _COORDINATOR_MOVED:
            self._cluster.invalidate_coordinator(self.group_id, GROUP_COORDINATOR)
            raise RetriableError(f"{api}: coordinator of group {self.group_id!r} moved or is loading", code)
        if code == ErrorCode.FENCED_INSTANCE_ID:
            raise FatalError(f"{api}: another consumer with group.instance.id {self.group_instance_id!r} "
                             "took this member's place", code)
        err = error_for(code) or KafkaError(f"{api} failed", code)
        if err.retriable:
            raise err
        if code in (ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ErrorCode.INVALID_SESSION_TIMEOUT,
                    ErrorCode.GROUP_AUTHORIZATION_FAILED, ErrorCode.INVALID_GROUP_ID,
                    ErrorCode.GROUP_MAX_SIZE_REACHED, ErrorCode.UNSUPPORTED_VERSION):
            raise FatalError(f"{api} for group {self.group_id!r}: {err.message}", code)
        raise err

    # -- join and sync -----------------------------------------------------------------------------------

    async def _join_and_sync(self) -> Assignment | None:
        """One JoinGroup + SyncGroup round; None when the group moved on and the round must be redone."""
        conn = await self._cluster.coordinator(self.group_id, GROUP_COORDINATOR)
        version = conn.api_version(ApiKey.JOIN_GROUP, 9, 0)
        metadata = encode_subscription(Subscription(sorted(self.topics)))
        join_timeout = self._rebalance_timeout_ms / 1000 + self._request_timeout
        for _ in range(3):  # MEMBER_ID_REQUIRED: the first join of a dynamic member only obtains its id
            resp = await conn.call(ApiKey.JOIN_GROUP, {
                "group_id": self.group_id, "session_timeout_ms": self._session_timeout_ms,
                "rebalance_timeout_ms": self._rebalance_timeout_ms, "member_id": self.member_id,
                "group_instance_id": self.group_instance_id, "protocol_type": CONSUMER_PROTOCOL_TYPE,
                "protocols": [{"name": name, "metadata": metadata} for name in self._strategies],
                "reason": None,
            }, version=version, timeout=join_timeout)
            if resp.error_code == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id
                continue
            break
        if not self._round_goes_on(resp.error_code, "JoinGroup"):
            return None
        self.member_id = resp.member_id
        self.generation_id = resp.generation_id
        self.protocol_name = resp.protocol_name
        self.leader_id = resp.leader
        assignments: list[dict[str, Any]] = []
        self._leader_counts = None
        if resp.leader == resp.member_id and not getattr(resp, "skip_assignment", False):
            assignments = await self._lead(resp.protocol_name, resp.members)
        sync_version = conn.api_version(ApiKey.SYNC_GROUP, 5, 0)
        sync = await conn.call(ApiKey.SYNC_GROUP, {
            "group_id": self.group_id, "generation_id": self.generation_id, "member_id": self.member_id,
            "group_instance_id": self.group_instance_id, "protocol_type": CONSUMER_PROTOCOL_TYPE,
            "protocol_name": self.protocol_name, "assignments": assignments,
        }, version=sync_version, timeout=join_timeout)
        if not self._round_goes_on(sync.error_code, "SyncGroup"):
            return None
        try:
            return decode_assignment(sync.assignment)
        except ConsumerProtocolError as exc:
            raise FatalError(f"group {self.group_id!r}: the leader's assignment does not parse: {exc}") from exc

    async def _lead(self, protocol: str, members: list[Any]) -> list[dict[str, Any]]:
        parsed: list[Member] = []
        for m in members:
            try:
                sub = decode_subscription(m.metadata)
            except ConsumerProtocolError as exc:
                raise FatalError(f"group {self.group_id!r}: member {m.member_id}'s subscription does not "
                                 f"parse: {exc}") from exc
            parsed.append(Member(m.member_id, getattr(m, "group_instance_id", None), sub))
        topics = sorted({t for m in parsed for t in m.subscription.topics})
        await self._cluster.refresh_metadata(topics, force=True)
        counts: dict[str, int] = {}
        for topic in topics:
            parts = self._cluster.partitions_for(topic)
            if parts:
                counts[topic] = len(parts)
        plan = assignor_for(protocol).assign(counts, parsed)
        self._leader_counts = counts
        log.info("group %s generation %d: leader assigned %s with %s", self.group_id, self.generation_id,
                 {mid: a.partitions for mid, a in plan.items()}, protocol)
        return [{"member_id": mid, "assignment": encode_assignment(a)} for mid, a in plan.items()]

    # -- leaving -----------------------------------------------------------------------------------------

    async def leave(self) -> None:
        """LeaveGroup, so the others rebalance now instead of after session.timeout.ms.

        A static member (group.instance.id) does not leave: KIP-345's point is that a restart
        within the session timeout keeps its assignment without a rebalance.
        """
        if not self.member_id or self.group_instance_id is not None:
            self._reset_member()
            return
        try:
            conn = await self._cluster.coordinator(self.group_id, GROUP_COORDINATOR,
                                                   timeout=self._request_timeout)
            version = conn.api_version(ApiKey.LEAVE_GROUP, 5, 0)
            await conn.call(ApiKey.LEAVE_GROUP, {
                "group_id": self.group_id, "member_id": self.member_id,
                "members": [{"member_id": self.member_id, "group_instance_id": None,
                             "reason": "the consumer is closing" if self._closing else "unsubscribe"}],
            }, version=version, timeout=self._request_timeout)
        except KafkaError as exc:
            log.info("group %s: LeaveGroup failed (%s); the session timeout will remove the member",
                     self.group_id, exc)
        finally:
            self._reset_member()
