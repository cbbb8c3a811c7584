"""The classic group protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and the timers behind them.

This follows Kafka's classic GroupCoordinator rule for rule, because every client's
consumer-group code was written against it:
- a rebalance completes when every member has a JoinGroup waiting, or when the rebalance
  timeout expires (dynamic members that did not rejoin are removed then); a new group
  first waits `group.initial.rebalance.delay.ms`, extended while members keep arriving;
- JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED with an id to rejoin with;
  that pending member holds the rebalance until it rejoins or its session timeout passes;
- a static member (group.instance.id) that rejoins without its member id replaces its old
  id (FENCED_INSTANCE_ID to the old one) and, in a Stable group, keeps its assignment
  without a rebalance;
- members that do not send SyncGroup within the rebalance timeout are removed;
- a member that stops heartbeating is removed after its session timeout, except while
  its JoinGroup or SyncGroup waits on the rebalance.

Everything runs on the event loop; waits happen only around durable writes, and state is
re-checked after each of them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from ...errors import ErrorCode
from .api import JoinRequest, JoinResult, LeavingMember, SyncResult
from .group import Group, GroupState, Member
from .records import RecordFormatError, encode_group_key, encode_group_value
from .store import Written

if TYPE_CHECKING:
    from .metrics import GroupMetrics
    from .settings import GroupSettings
    from .store import OffsetsLog

log = logging.getLogger("oncelog.groups")

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


def group_write_error(error: ErrorCode) -> ErrorCode:
    """What a failed group-metadata write tells the members (Kafka's storeGroup mapping)."""
    if error in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                 ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if error == ErrorCode.REQUEST_TIMED_OUT:
        return ErrorCode.REBALANCE_IN_PROGRESS
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.UNKNOWN_SERVER_ERROR
    return error


class Membership:
    def __init__(self, groups: dict[str, Group], settings: GroupSettings, log_: OffsetsLog,
                 metrics: GroupMetrics, clock: Callable[[], int]) -> None:
        self.groups = groups
        self.settings = settings
        self.log = log_
        self.metrics = metrics
        self.clock = clock

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Loaded members get a full session to come back (the broker was away, not they)."""
        self.resume(self.groups.values())

    def resume(self, groups: Iterable[Group]) -> None:
        """Groups just loaded: each member gets a full session from now (its coordinator moved, not it)."""
        for group in groups:
            for member in group.members.values():
                self._schedule_session(group, member)

    def stop(self) -> None:
        """Cancel every timer and answer every waiting request: this coordinator is going away."""
        for group in self.groups.values():
            self._abandon(group)

    def unload(self, group: Group) -> None:
        """The group's partition is led elsewhere now (Kafka's onGroupUnloaded): the group is Dead here, so
        anything still holding it (a request past its write, a timer) changes nothing, and its waiting members
        are told NOT_COORDINATOR so they find the new coordinator."""
        if not group.is_(DEAD):
            group.transition(DEAD, self.clock())
        self._abandon(group)

    def _abandon(self, group: Group) -> None:
        self.cancel_group_timers(group)
        for member in group.members.values():
            self._cancel_session(member)
            self._resolve_join(member, JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
            self._resolve_sync(member, SyncResult(ErrorCode.NOT_COORDINATOR))

    # -- JoinGroup --------------------------------------------------------------------------------------------
    async def join(self, r: JoinRequest) -> JoinResult:
        s = self.settings
        if not r.group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, r.member_id)
        if not s.min_session_timeout_ms <= r.session_timeout_ms <= s.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, r.member_id)
        size = sum(len(metadata) for _, metadata in r.protocols)
        if size > s.max_member_metadata_bytes:
            log.warning("group %s: JoinGroup from %s refused: %d bytes of protocol metadata, more than the %d "
                        "a group record can hold", r.group_id, r.client_id, size, s.max_member_metadata_bytes)
            return JoinResult(ErrorCode.INVALID_REQUEST, r.member_id)
        group = self.groups.get(r.group_id)
        if group is None:
            if r.member_id:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, r.member_id)
            group = self.groups[r.group_id] = Group(r.group_id)
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        follow_up: Awaitable[None] | None = None
        if not self._accept_joining_member(group, r.member_id):
            member = group.members.get(r.member_id)
            if member is not None:
                self._drop_member(group, member)
            waiter.set_result(JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, ""))
        elif not r.member_id:
            follow_up = self._join_new_member(group, r, waiter)
        else:
            self._join_current_member(group, r, waiter)
        if group.is_(PREPARING):
            self._try_complete_join(group)
        if follow_up is not None:
            await follow_up
        result = await waiter
        if result.error:
            self._forget_if_unused(group)
        return result

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        """Kafka's group.max.size check: awaiting members count during a rebalance, members otherwise."""
        limit = self.settings.group_max_size
        if group.state in (EMPTY, DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_(PREPARING):
            return (member is not None and member.awaiting_join) or group.num_awaiting_join < limit
        return member is not None or len(group.members) < limit

    def _join_new_member(self, group: Group, r: JoinRequest, waiter: asyncio.Future) -> Awaitable[None] | None:
        if group.is_(DEAD):
            waiter.set_result(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, ""))
            return None
        if not group.supports_protocols(r.protocol_type, {name for name, _ in r.protocols}):
            waiter.set_result(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ""))
            return None
        new_id = f"{r.group_instance_id if r.group_instance_id is not None else r.client_id}-{uuid.uuid4()}"
        if r.group_instance_id is not None:
            old_id = group.static_members.get(r.group_instance_id)
            if old_id is not None:
                return self._replace_static_member(group, old_id, new_id, r, waiter)
            self._add_member_and_rebalance(group, new_id, r, waiter)
        elif r.require_known_member_id:
            group.pending_members.add(new_id)
            group.pending_timers[new_id] = asyncio.get_running_loop().call_later(
                r.session_timeout_ms / 1000, self._on_pending_expired, group, new_id)
            waiter.set_result(JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id))
        else:
            self._add_member_and_rebalance(group, new_id, r, waiter)
        return None

    def _join_current_member(self, group: Group, r: JoinRequest, waiter: asyncio.Future) -> None:
        member_id = r.member_id
        if group.is_(DEAD):
            waiter.set_result(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id))
            return
        if not group.supports_protocols(r.protocol_type, {name for name, _ in r.protocols}):
            waiter.set_result(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        if member_id in group.pending_members:
            if r.group_instance_id is not None:  # a pending id is never a static member's
                waiter.set_result(JoinResult(group.validate_member(member_id, r.group_instance_id)
                                             or ErrorCode.UNKNOWN_MEMBER_ID, member_id))
                return
            timer = group.pending_timers.pop(member_id, None)
            if timer is not None:
                timer.cancel()
            self._add_member_and_rebalance(group, member_id, r, waiter)
            return
        error = group.validate_member(member_id, r.group_instance_id)
        if error:
            waiter.set_result(JoinResult(error, member_id))
            return
        member = group.members[member_id]
        if group.is_(PREPARING):
            self._update_member_and_rebalance(group, member, r, waiter, "member rejoined during the rebalance")
        elif group.is_(COMPLETING):
            if member.matches(r.protocols):
                # It missed the JoinGroup answer: send this generation's again.
                waiter.set_result(self._generation_result(group, member_id, group.is_leader(member_id)))
            else:
                self._update_member_and_rebalance(group, member, r, waiter, "member changed its metadata")
        elif group.is_(STABLE):
            if group.is_leader(member_id):
                self._update_member_and_rebalance(group, member, r, waiter, "the leader rejoined")
            elif not member.matches(r.protocols):
                self._update_member_and_rebalance(group, member, r, waiter, "member changed its metadata")
            else:
                waiter.set_result(self._generation_result(group, member_id, False))
        else:
            waiter.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id))

    def _generation_result(self, group: Group, member_id: str, include_members: bool) -> JoinResult:
        return JoinResult(
            ErrorCode.NONE, member_id, group.generation, group.protocol_type, group.protocol_name,
            group.leader_id or "", False, group.current_member_metadata() if include_members else [],
        )

    def _add_member_and_rebalance(self, group: Group, member_id: str, r: JoinRequest,
                                  waiter: asyncio.Future) -> None:
        member = Member(member_id, r.group_instance_id, r.client_id, r.client_host, r.rebalance_timeout_ms,
                        r.session_timeout_ms, r.protocol_type, list(r.protocols), is_new=True)
        if group.is_(PREPARING) and group.generation == 0:
            group.new_member_added = True
        group.add(member, waiter)
        # A new member cannot heartbeat before its first JoinGroup answer, so its session timeout does not
        # apply yet; a long join timeout removes it if it went away meanwhile.
        self._schedule_session(group, member, self.settings.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group, f"member {member_id} joined")

    def _update_member_and_rebalance(self, group: Group, member: Member, r: JoinRequest,
                                     waiter: asyncio.Future, reason: str) -> None:
        previous = member.join_waiter
        group.update_member(member, list(r.protocols), r.rebalance_timeout_ms, r.session_timeout_ms, waiter)
        if previous is not None and previous is not waiter and not previous.done():
            # A retried JoinGroup replaces the first; answer the first so its connection is not stuck.
            previous.set_result(JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        self._maybe_prepare_rebalance(group, reason)

    def _replace_static_member(self, group: Group, old_id: str, new_id: str, r: JoinRequest,
                               waiter: asyncio.Future) -> Awaitable[None] | None:
        instance_id = r.group_instance_id
        assert instance_id is not None
        previous_leader = group.leader_id
        member = group.members[old_id]
        self._resolve_join(member, JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
        self._resolve_sync(member, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        group.replace_static_member(instance_id, old_id, new_id)
        self._schedule_session(group, member)
        before = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
        group.update_member(member, list(r.protocols), r.rebalance_timeout_ms, r.session_timeout_ms, waiter)
        log.info("group %s: static member %s rejoined; member id %s replaces %s", group.group_id, instance_id,
                 new_id, old_id)
        if group.is_(STABLE):
            try:
                same_protocol = group.protocol_name == group.select_protocol()
            except ValueError:
                same_protocol = False
            if same_protocol:
                # Same protocol next generation: no rebalance, just persist the new member id.
                written = self._write_group(group, {m.member_id: m.assignment for m in group.members.values()})
                return self._finish_static_replacement(group, member, instance_id, old_id, before,
                                                       previous_leader, r.supports_skip_assignment, written)
            self._maybe_prepare_rebalance(group, f"static member {instance_id} changed the group's protocol")
        elif group.is_(COMPLETING):
            # The leader may be assigning to the old id right now: start over.
            self._prepare_rebalance(group, f"static member {instance_id} rejoined during the rebalance")
        return None

    async def _finish_static_replacement(self, group: Group, member: Member, instance_id: str, old_id: str,
                                         before: tuple[list[tuple[str, bytes]], int, int],
                                         previous_leader: str | None, skip: bool, written: Written) -> None:
        error = group_write_error(await self.log.durable(written))
        new_id = member.member_id
        if group.members.get(new_id) is not member or member.join_waiter is None:
            return  # a rebalance or another replacement answered it meanwhile
        if error:
            log.warning("group %s: could not persist static member %s: %s", group.group_id, instance_id, error.name)
            waiter = member.join_waiter
            group.update_member(member, before[0], before[1], before[2], None)
            group.replace_static_member(instance_id, new_id, old_id)
            self._schedule_session(group, member)
            if not waiter.done():
                waiter.set_result(JoinResult(error, "", group.generation, group.protocol_type,
                                             group.protocol_name, previous_leader or ""))
            return
        if skip:
            # JoinGroup v9 (KIP-814): the leader learns it leads, but must not run the assignor.
            leader = group.is_leader(new_id)
            result = JoinResult(ErrorCode.NONE, new_id, group.generation, group.protocol_type, group.protocol_name,
                                group.leader_id or "", leader, group.current_member_metadata() if leader else [])
        else:
            # Older versions: name the previous leader id, so a rejoining leader does not assign.
            result = JoinResult(ErrorCode.NONE, new_id, group.generation, group.protocol_type,
                                group.protocol_name, previous_leader or "")
        self._resolve_join(member, result)

    # -- rebalances --------------------------------------------------------------------------------------------
    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_(COMPLETING):
            self._reset_and_propagate(group, ErrorCode.REBALANCE_IN_PROGRESS)
        self._cancel_sync_timer(group)
        group.pending_sync.clear()
        was_empty = group.is_(EMPTY)
        group.transition(PREPARING, self.clock())
        self.metrics.rebalances.inc()
        log.info("group %s: preparing to rebalance (generation %d): %s", group.group_id, group.generation, reason)
        self._cancel_join_timer(group)
        if was_empty:
            delay = self.settings.initial_rebalance_delay_ms
            self._schedule_initial_join(group, delay, max(group.rebalance_timeout_ms - delay, 0))
        else:
            self._schedule_join_timeout(group)
            self._try_complete_join(group)

    def _schedule_initial_join(self, group: Group, delay_ms: int, remaining_ms: int) -> None:
        group.initial_join = True
        group.join_timer = asyncio.get_running_loop().call_later(
            delay_ms / 1000, self._on_initial_join_timer, group, delay_ms, remaining_ms)

    def _on_initial_join_timer(self, group: Group, delay_ms: int, remaining_ms: int) -> None:
        group.join_timer = None
        if not group.is_(PREPARING):
            return
        if group.new_member_added and remaining_ms != 0:
            group.new_member_added = False
            self._schedule_initial_join(group, min(self.settings.initial_rebalance_delay_ms, remaining_ms),
                                        max(remaining_ms - delay_ms, 0))
            return
        group.initial_join = False
        self._complete_join(group)

    def _schedule_join_timeout(self, group: Group) -> None:
        group.initial_join = False
        group.join_timer = asyncio.get_running_loop().call_later(
            group.rebalance_timeout_ms / 1000, self._on_join_timeout, group)

    def _on_join_timeout(self, group: Group) -> None:
        group.join_timer = None
        if group.is_(PREPARING):
            self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if group.is_(PREPARING) and not group.initial_join and group.has_all_members_joined():
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        self._cancel_join_timer(group)
        group.initial_join = False
        gone = [m for m in group.not_yet_rejoined() if not m.is_static]
        for member in gone:
            self._drop_member(group, member)
        if gone:
            log.info("group %s: removed members that did not rejoin in time: %s", group.group_id,
                     [m.member_id for m in gone])
        if group.is_(DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            log.warning("group %s: no member rejoined; waiting another rebalance timeout", group.group_id)
            self._schedule_join_timeout(group)
            return
        group.init_next_generation(self.clock())
        if group.is_(EMPTY):
            log.info("group %s: generation %d is empty", group.group_id, group.generation)
            # Not awaited (Kafka does not either): a lost record only means the previous generation comes
            # back after a crash, and its members time out.
            self._write_group(group, {})
            return
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", group.group_id,
                 group.generation, len(group.members), group.protocol_name, group.leader_id)
        for member in list(group.members.values()):
            self._resolve_join(member, self._generation_result(group, member.member_id,
                                                               group.is_leader(member.member_id)))
            self._schedule_session(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_timer = asyncio.get_running_loop().call_later(
            group.rebalance_timeout_ms / 1000, self._on_sync_timeout, group, group.generation)

    def _on_sync_timeout(self, group: Group, generation: int) -> None:
        group.sync_timer = None
        if generation != group.generation or group.state not in (COMPLETING, STABLE) or not group.pending_sync:
            return
        late = [group.members[m] for m in group.pending_sync if m in group.members]
        for member in late:
            self._drop_member(group, member)
        self._prepare_rebalance(group, f"members {[m.member_id for m in late]} sent no SyncGroup in time")

    # -- SyncGroup ----------------------------------------------------------------------------------------------
    async def sync(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                   protocol_type: str | None, protocol_name: str | None,
                   assignments: dict[str, bytes]) -> SyncResult:
        if not group_id:
            return SyncResult(ErrorCode.INVALID_GROUP_ID)
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_(DEAD):
            return SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = group.validate_member(member_id, instance_id)
        if error is None and generation != group.generation:
            error = ErrorCode.ILLEGAL_GENERATION
        if error is None and (
            (protocol_type is not None and protocol_type != group.protocol_type)
            or (protocol_name is not None and protocol_name != group.protocol_name)
        ):
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is not None:
            return SyncResult(error)
        if group.is_(EMPTY):
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_(PREPARING):
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        if group.is_(STABLE):
            self._synced(group, member_id)
            self._schedule_session(group, member)
            return SyncResult(ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment)
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        if member.sync_waiter is not None and not member.sync_waiter.done():
            member.sync_waiter.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_waiter = waiter
        self._synced(group, member_id)
        if group.is_leader(member_id):
            missing = [m for m in group.members if m not in assignments]
            if missing:
                log.warning("group %s: the leader gave no assignment to %s in generation %d", group_id, missing,
                            generation)
            assignment = {m: assignments.get(m, b"") for m in group.members}
            written = self._write_group(group, assignment)
            error = group_write_error(await self.log.durable(written))
            if group.is_(COMPLETING) and group.generation == generation:
                if error:
                    self._reset_and_propagate(group, error)
                    self._maybe_prepare_rebalance(group, f"the group's assignment could not be stored: {error.name}")
                else:
                    for m in group.members.values():
                        m.assignment = assignment.get(m.member_id, b"")
                    self._propagate(group, ErrorCode.NONE)
                    group.transition(STABLE, self.clock())
        if not waiter.done() and member.sync_waiter is not waiter:
            waiter.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))  # superseded without an answer
        return await waiter

    def _synced(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self._cancel_sync_timer(group)

    def _reset_and_propagate(self, group: Group, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate(group, error)

    def _propagate(self, group: Group, error: ErrorCode) -> None:
        ok = error == ErrorCode.NONE
        for member in group.members.values():
            result = SyncResult(error, group.protocol_type if ok else None, group.protocol_name if ok else None,
                                member.assignment)
            if self._resolve_sync(member, result):
                self._schedule_session(group, member)

    # -- Heartbeat and LeaveGroup -------------------------------------------------------------------------------
    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> ErrorCode:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.is_(DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = group.validate_member(member_id, instance_id)
        if error is not None:
            return error
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.is_(EMPTY):
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_session(group, group.members[member_id])
        if group.is_(PREPARING):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def touch(self, group: Group, member_id: str) -> None:
        """A request from a member that counts as a heartbeat (an offset commit)."""
        member = group.members.get(member_id)
        if member is not None:
            self._schedule_session(group, member)

    def leave(self, group_id: str, leaving: list[LeavingMember]) -> tuple[ErrorCode, list[ErrorCode]]:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, []
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
        if group.is_(DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        errors = []
        for lm in leaving:
            reason = f"member left the group ({lm.reason or 'no reason given'})"
            if not lm.member_id:
                # Removal by group.instance.id (the admin client's removeMembersFromConsumerGroup).
                current = group.static_members.get(lm.group_instance_id) if lm.group_instance_id else None
                if current is None:
                    errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                self._remove_member_and_update(group, group.members[current], reason)
                errors.append(ErrorCode.NONE)
            elif lm.member_id in group.pending_members:
                group.pending_members.discard(lm.member_id)
                timer = group.pending_timers.pop(lm.member_id, None)
                if timer is not None:
                    timer.cancel()
                if group.is_(PREPARING):
                    self._try_complete_join(group)
                errors.append(ErrorCode.NONE)
            else:
                error = group.validate_member(lm.member_id, lm.group_instance_id)
                if error is None:
                    log.info("group %s: member %s left (%s)", group_id, lm.member_id, lm.reason or "no reason given")
                    self._remove_member_and_update(group, group.members[lm.member_id], reason)
                errors.append(error or ErrorCode.NONE)
        self._forget_if_unused(group)
        return ErrorCode.NONE, errors

    # -- removal and expiry ---------------------------------------------------------------------------------------
    def _remove_member_and_update(self, group: Group, member: Member, reason: str) -> None:
        self._drop_member(group, member)
        if group.state in (STABLE, COMPLETING):
            self._maybe_prepare_rebalance(group, reason)
        elif group.is_(PREPARING):
            self._try_complete_join(group)

    def _drop_member(self, group: Group, member: Member) -> None:
        self._cancel_session(member)
        self._resolve_join(member, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, ""))
        self._resolve_sync(member, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)

    def _on_session_expired(self, group: Group, member: Member) -> None:
        member.session_timer = None
        if group.is_(DEAD) or group.members.get(member.member_id) is not member:
            return
        if not member.is_new and (member.awaiting_join or member.awaiting_sync):
            return  # waiting on the rebalance counts as alive; answering it schedules the next check
        log.info("group %s: member %s timed out (no heartbeat for %d ms)", group.group_id, member.member_id,
                 member.session_timeout_ms if not member.is_new else self.settings.new_member_join_timeout_ms)
        self._remove_member_and_update(group, member, f"member {member.member_id} timed out")

    def _on_pending_expired(self, group: Group, member_id: str) -> None:
        group.pending_timers.pop(member_id, None)
        if member_id not in group.pending_members:
            return
        group.pending_members.discard(member_id)
        if group.is_(PREPARING):
            self._try_complete_join(group)
        self._forget_if_unused(group)

    def _forget_if_unused(self, group: Group) -> None:
        """Drop a group that a failed first JoinGroup created and nothing else uses."""
        if (group.is_(EMPTY) and group.generation == 0 and not group.members and not group.pending_members
                and not group.offsets.has_offsets and self.groups.get(group.group_id) is group):
            del self.groups[group.group_id]

    # -- persistence ------------------------------------------------------------------------------------------------
    def _write_group(self, group: Group, assignment: dict[str, bytes]) -> Written:
        try:
            value = encode_group_value(group.to_value(assignment))
        except RecordFormatError as exc:
            return Written(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc))
        written = self.log.append(self.log.partition_for(group.group_id),
                                  [(encode_group_key(group.group_id), value)], self.clock())
        if written.error:
            log.warning("group %s: group metadata not written: %s %s", group.group_id, written.error.name,
                        written.message or "")
        return written

    # -- timers and waiters ---------------------------------------------------------------------------------------
    def _schedule_session(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        self._cancel_session(member)
        timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
        member.session_timer = asyncio.get_running_loop().call_later(
            timeout / 1000, self._on_session_expired, group, member)

    @staticmethod
    def _cancel_session(member: Member) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None

    @staticmethod
    def _cancel_join_timer(group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None

    @staticmethod
    def _cancel_sync_timer(group: Group) -> None:
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    def cancel_group_timers(self, group: Group) -> None:
        self._cancel_join_timer(group)
        self._cancel_sync_timer(group)
        for timer in group.pending_timers.values():
            timer.cancel()
        group.pending_timers.clear()

    @staticmethod
    def _resolve_join(member: Member, result: JoinResult) -> bool:
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is None:
            return False
        if not waiter.done():
            waiter.set_result(result)
        return True

    @staticmethod
    def _resolve_sync(member: Member, result: SyncResult) -> bool:
        waiter, member.sync_waiter = member.sync_waiter, None
        if waiter is None:
            return False
        if not waiter.done():
            waiter.set_result(result)
        return True
