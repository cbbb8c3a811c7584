"""What CreateTopics and CreatePartitions would create, or the error Kafka answers, as pure functions.

The controller turns a plan into one multi-op; everything that can be refused is refused here, before any
write, with the error code and message Kafka's controller gives (admin tools print those messages). Initial
partition states follow KRaft: the ISR is the assigned replicas that are usable (alive and not shutting down),
the first of them leads, at leader epoch 0.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from oncelog.config import ConfigError, parse_topic_overrides, topic_name_problem
from oncelog.errors import ErrorCode

from .metadata_image import TopicInfo
from .placement import (
    PlacementError,
    assign_new_partitions,
    assign_replicas,
    validate_assignment,
    validate_replicas,
)


@dataclass
class NewTopic:
    """One topic of CreateTopics: a count and replication factor (-1: the broker's defaults), or an explicit
    assignment {partition: replicas} (then both must be -1). `configs` are the topic's overrides."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: Mapping[int, Sequence[int]] | Sequence[tuple[int, Sequence[int]]] | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicPlan:
    """Replicas per partition, and each new partition's (leader, ISR)."""

    assignment: dict[int, list[int]]
    initial: dict[int, tuple[int, list[int]]]

    @property
    def replication_factor(self) -> int:
        return len(next(iter(self.assignment.values()))) if self.assignment else 0


def topic_collision(name: str, existing: Iterable[str]) -> str | None:
    """An existing topic whose name differs from `name` only by '.' versus '_' (Kafka refuses it: both map to
    the same metric names)."""
    if "." not in name and "_" not in name:
        return None
    unified = name.replace(".", "_")
    return next((o for o in existing if o != name and o.replace(".", "_") == unified), None)


def initial_states(assignment: Mapping[int, Sequence[int]], usable: Collection[int]) -> dict[int, tuple[int, list[int]]]:
    """Leader = the first usable replica, ISR = the usable replicas (empty logs are in sync)."""
    out = {}
    for p, replicas in sorted(assignment.items()):
        isr = [r for r in replicas if r in usable]
        if not isr:
            raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"All brokers specified in the manual partition assignment for partition {p} are "
                                 f"fenced or in controlled shutdown.")
        out[p] = (isr[0], isr)
    return out


def plan_new_topic(
    topic: NewTopic,
    registered: Collection[int],
    usable: Collection[int],
    existing_topics: Collection[str],
    default_partitions: int,
    default_replication_factor: int,
) -> TopicPlan:
    """CreateTopics for one topic; raises PlacementError(code, message) with Kafka's answer when refused.
    `registered` are the live brokers, `usable` those of them not in controlled shutdown."""
    name = topic.name
    problem = topic_name_problem(name)
    if problem:
        raise PlacementError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
    if name in existing_topics:
        raise PlacementError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    collides = topic_collision(name, existing_topics)
    if collides:
        raise PlacementError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                             f"Topic '{name}' collides with existing topic: {collides}")
    try:
        parse_topic_overrides(topic.configs)
    except ConfigError as exc:
        raise PlacementError(ErrorCode.INVALID_CONFIG, str(exc)) from None
    if topic.assignments:
        if topic.replication_factor != -1:
            raise PlacementError(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but "
                                                            "replication factor was not set to -1.")
        if topic.num_partitions != -1:
            raise PlacementError(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but "
                                                            "numPartitions was not set to -1.")
        assignment = validate_assignment(topic.assignments, registered)
    else:
        rf, count = topic.replication_factor, topic.num_partitions
        if rf < -1 or rf == 0:
            raise PlacementError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                 "Replication factor must be larger than 0, or -1 to use the default value.")
        if count < -1 or count == 0:
            raise PlacementError(ErrorCode.INVALID_PARTITIONS,
                                 "Number of partitions was set to an invalid non-positive value.")
        rf = default_replication_factor if rf == -1 else rf
        count = default_partitions if count == -1 else count
        try:
            assignment = assign_replicas(sorted(usable), count, rf)
        except PlacementError as exc:
            raise PlacementError(exc.code, f"Unable to replicate the partition {rf} time(s): {exc.message}") from None
    return TopicPlan(assignment, initial_states(assignment, usable))


def plan_new_partitions(
    info: TopicInfo,
    count: int,
    assignments: Sequence[Sequence[int]] | None,
    registered: Collection[int],
    usable: Collection[int],
) -> TopicPlan:
    """CreatePartitions for one topic: the partitions added to reach `count`, placed like the topic's (or as
    `assignments` says); raises PlacementError with Kafka's answer when refused."""
    current = info.partition_count
    if any(a.reassigning for a in info.assignment.values()):
        raise PlacementError(ErrorCode.REASSIGNMENT_IN_PROGRESS,
                             f"A partition reassignment is in progress for topic {info.name}.")
    if count < current:
        raise PlacementError(ErrorCode.INVALID_PARTITIONS,
                             f"The topic {info.name} currently has {current} partition(s); {count} would not be an "
                             f"increase.")
    if count == current:
        raise PlacementError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
    added = count - current
    if assignments is not None:
        if len(assignments) != added:
            raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"Attempted to add {added} additional partition(s), but only {len(assignments)} "
                                 f"assignment(s) were specified.")
        for replicas in assignments:
            validate_replicas(replicas, registered, info.replication_factor)
        new = {current + i: list(r) for i, r in enumerate(assignments)}
    else:
        existing = {p: list(a.target) for p, a in info.assignment.items()}
        new = assign_new_partitions(sorted(usable), existing, count)
    return TopicPlan(new, initial_states(new, usable))
