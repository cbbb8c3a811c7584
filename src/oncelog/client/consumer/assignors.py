"""The group leader's partition assignors: Kafka's "range" and "roundrobin".

The names are the protocol names every client uses in JoinGroup, so a group mixing our
consumers with librdkafka or Java members agrees on one of them (the coordinator picks a
protocol all members list) and any member elected leader computes the same kind of plan.
Members are ordered as Java orders them: static members (group.instance.id) by instance id
first, then dynamic ones by member id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from oncelog.client.consumer.protocol import Assignment, Subscription


@dataclass(frozen=True)
class Member:
    member_id: str
    group_instance_id: str | None
    subscription: Subscription

    def sort_key(self) -> tuple[bool, str, str]:
        return (self.group_instance_id is None, self.group_instance_id or "", self.member_id)


class Assignor(Protocol):
    name: str

    def assign(self, partitions_per_topic: Mapping[str, int], members: list[Member]) -> dict[str, Assignment]:
        """member id -> assignment; topics missing from `partitions_per_topic` are not assigned."""
        ...


class RangeAssignor:
    """Per topic, consecutive partition ranges; the first (partitions % members) members get one more."""

    name = "range"

    def assign(self, partitions_per_topic: Mapping[str, int], members: list[Member]) -> dict[str, Assignment]:
        plan: dict[str, dict[str, list[int]]] = {m.member_id: {} for m in members}
        ordered = sorted(members, key=Member.sort_key)
        for topic in sorted(partitions_per_topic):
            subscribers = [m for m in ordered if topic in m.subscription.topics]
            if not subscribers:
                continue
            count = partitions_per_topic[topic]
            per, extra = divmod(count, len(subscribers))
            start = 0
            for i, member in enumerate(subscribers):
                length = per + (1 if i < extra else 0)
                if length:
                    plan[member.member_id][topic] = list(range(start, start + length))
                start += length
        return {member_id: Assignment(parts) for member_id, parts in plan.items()}


class RoundRobinAssignor:
    """Every partition of every subscribed topic, sorted, dealt out to the members in turn.

    A partition goes to the next member in the circle that subscribes to its topic, so members
    with different subscriptions still get a fair share of what they can take.
    """

    name = "roundrobin"

    def assign(self, partitions_per_topic: Mapping[str, int], members: list[Member]) -> dict[str, Assignment]:
        plan: dict[str, dict[str, list[int]]] = {m.member_id: {} for m in members}
        ordered = sorted(members, key=Member.sort_key)
        if not ordered:
            return {}
        subscribed = set().union(*(set(m.subscription.topics) for m in ordered))
        turn = 0
        for topic in sorted(t for t in partitions_per_topic if t in subscribed):
            for partition in range(partitions_per_topic[topic]):
                for step in range(len(ordered)):
                    member = ordered[(turn + step) % len(ordered)]
                    if topic in member.subscription.topics:
                        plan[member.member_id].setdefault(topic, []).append(partition)
                        turn = (turn + step + 1) % len(ordered)
                        break
        return {member_id: Assignment(parts) for member_id, parts in plan.items()}


ASSIGNORS: dict[str, type[RangeAssignor] | type[RoundRobinAssignor]] = {
    RangeAssignor.name: RangeAssignor,
    RoundRobinAssignor.name: RoundRobinAssignor,
}


def assignor_for(name: str) -> Assignor:
    try:
        return ASSIGNORS[name]()
    except KeyError:
        raise ValueError(f"unknown partition.assignment.strategy {name!r}; known: {', '.join(ASSIGNORS)}") from None
