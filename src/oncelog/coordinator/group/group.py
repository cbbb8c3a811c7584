"""One classic group: its members, state and generation, without any I/O or timers.

This is the bookkeeping half of Kafka's classic group coordinator (GroupMetadata and
MemberMetadata); the coordinator drives it and owns timers and persistence. A member's
pending JoinGroup or SyncGroup is an asyncio future held here, because "is this member
waiting for the rebalance" is part of the group's state: a rebalance completes when every
member has a JoinGroup waiting.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ...errors import ErrorCode
from .consumer_protocol import group_subscriptions
from .offsets import GroupOffsets
from .records import GroupValue, MemberValue


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Kafka's valid previous states of each state.
_PREVIOUS = {
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.DEAD: set(GroupState),
}

STATE_BY_LOWER_NAME = {s.value.lower(): s for s in GroupState}


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    # True from the first join until the first rebalance that includes it completes: such a member
    # expires on its (long) join timeout even while its JoinGroup waits.
    is_new: bool = False
    join_waiter: asyncio.Future | None = None
    sync_waiter: asyncio.Future | None = None
    session_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise KeyError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    state_timestamp: int | None = None  # when the group entered its state (offset expiry of Empty groups)
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: set[str] = field(default_factory=set)  # got MEMBER_ID_REQUIRED, not joined yet
    pending_sync: set[str] = field(default_factory=set)  # joined this generation, no SyncGroup yet
    subscribed_topics: set[str] | None = None
    new_member_added: bool = False  # extends the initial rebalance delay of a new group
    offsets: GroupOffsets = field(default_factory=GroupOffsets)
    supported: Counter = field(default_factory=Counter)  # protocol name -> members supporting it
    # Timers the coordinator owns; kept here so that they die with the group.
    join_timer: asyncio.TimerHandle | None = None
    initial_join: bool = False  # the join timer is the initial delay: joins do not complete early
    sync_timer: asyncio.TimerHandle | None = None
    pending_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    # -- state --------------------------------------------------------------------------------------------
    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def transition(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _PREVIOUS[state]:
            raise RuntimeError(f"group {self.group_id}: illegal transition {self.state.value} -> {state.value}")
        self.state = state
        self.state_timestamp = now_ms

    @property
    def can_rebalance(self) -> bool:
        return self.state in _PREVIOUS[GroupState.PREPARING_REBALANCE]

    # -- members ------------------------------------------------------------------------------------------
    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    @property
    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def has_all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.awaiting_join]

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def add(self, member: Member, waiter: asyncio.Future | None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError(f"static member {member.group_instance_id} is already in {self.group_id}")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported.update(name for name, _ in member.protocols)
        member.join_waiter = waiter
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported.subtract(name for name, _ in member.protocols)
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def update_member(self, member: Member, protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
                      session_timeout_ms: int, waiter: asyncio.Future | None) -> None:
        self.supported.subtract(name for name, _ in member.protocols)
        member.protocols = protocols
        self.supported.update(name for name, _ in protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.join_waiter = waiter

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """Give the static member a new member id; the caller answers the old id's waiting requests."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        self.static_members[instance_id] = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """Is this request from a current member? FENCED_INSTANCE_ID when a static member's id is stale."""
        if instance_id is not None:
            current = self.static_members.get(instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did; False if nobody rejoined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.awaiting_join:
                self.leader_id = member_id
                return True
        return False

    # -- protocols ----------------------------------------------------------------------------------------
    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {name for name, count in self.supported.items() if count == n and n > 0}

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        if self.is_(GroupState.EMPTY):
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self.supported.get(name, 0) == n for name in names)

    def select_protocol(self) -> str:
        """Each member votes for its preferred common protocol; the most votes win (ties: first seen)."""
        if not self.members:
            raise RuntimeError("cannot select a protocol for an empty group")
        candidates = self.candidate_protocols()
        votes: Counter = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=lambda name: votes[name])

    def init_next_generation(self, now_ms: int) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition(GroupState.EMPTY, now_ms)
        self.subscribed_topics = self.compute_subscribed_topics()
        self.pending_sync.clear()

    def compute_subscribed_topics(self) -> set[str] | None:
        if not self.members:
            return set() if self.protocol_type == "consumer" else None
        if self.protocol_name is None:
            return None
        return group_subscriptions(self.protocol_type,
                                   (m.metadata(self.protocol_name) for m in self.members.values()))

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribed_topics is None or topic in self.subscribed_topics

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        """(member id, group.instance.id, metadata of the chosen protocol): what the leader assigns from."""
        assert self.protocol_name is not None
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]

    # -- views ----------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """DescribeGroups' view: metadata and assignments only once Stable, as Kafka shows them."""
        stable = self.is_(GroupState.STABLE)
        members = []
        for m in self.members.values():
            members.append({
                "member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata(self.protocol_name) if stable and self.protocol_name else b"",
                "member_assignment": m.assignment if stable else b"",
            })
        return {
            "group_id": self.group_id, "group_state": self.state.value, "protocol_type": self.protocol_type or "",
            "protocol_data": (self.protocol_name or "") if stable else "", "members": members,
        }

    # -- the group-metadata record -------------------------------------------------------------------------
    def to_value(self, assignment: dict[str, bytes]) -> GroupValue:
        """The GroupMetadataValue Kafka writes for this generation (with `assignment` for its members)."""
        members = []
        if self.members:
            assert self.protocol_name is not None
            for m in self.members.values():
                members.append(MemberValue(
                    m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                    m.session_timeout_ms, m.metadata(self.protocol_name), assignment.get(m.member_id, b""),
                ))
        return GroupValue(self.protocol_type or "", self.generation, self.protocol_name, self.leader_id,
                          -1 if self.state_timestamp is None else self.state_timestamp, members)

    @classmethod
    def from_value(cls, group_id: str, value: GroupValue) -> Group:
        """A group as the log last described it: Stable with its members, or Empty."""
        group = cls(group_id, GroupState.STABLE if value.members else GroupState.EMPTY, value.generation,
                    value.protocol_type or None, value.protocol, value.leader,
                    None if value.current_state_timestamp < 0 else value.current_state_timestamp)
        for mv in value.members:
            member = Member(mv.member_id, mv.group_instance_id, mv.client_id, mv.client_host,
                            mv.rebalance_timeout, mv.session_timeout, value.protocol_type,
                            [(value.protocol or "", mv.subscription)], mv.assignment)
            group.members[mv.member_id] = member
            group.supported.update(name for name, _ in member.protocols)
            if mv.group_instance_id is not None:
                group.static_members[mv.group_instance_id] = mv.member_id
        if group.leader_id is not None and group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.subscribed_topics = group.compute_subscribed_topics()
        return group
