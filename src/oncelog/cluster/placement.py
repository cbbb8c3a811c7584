"""Replica placement: where a new topic's (or a new partition's) replicas go, and checks of explicit assignments.

Automatic placement is Kafka's rack-unaware assignment (ZooKeeper-era `AdminUtils.assignReplicasToBrokers`),
so a topic created here lands the way operators expect from Kafka: brokers sorted by id; partition p's first
replica (its preferred leader) is broker (p + start) mod n, which spreads leaders round-robin; the followers
follow at a distance of 1 + (shift + j) mod (n - 1), and the shift grows by one every n partitions, so the
followers of one broker's leaderships are spread over the others instead of always landing on its neighbour.
`start` and the first `shift` are random unless given, as in Kafka, so that many small topics do not all lead on
the same broker.

Explicit assignments are checked the way Kafka's controller checks them (KRaft's
`validateManualPartitionAssignment`), with its error codes and messages, because admin tools show those
messages to people.

Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

from oncelog.errors import ErrorCode


class PlacementError(Exception):
    """An assignment Kafka would refuse: `code` is the error code to answer, `message` its text."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def replication_factor_problem(replication_factor: int, brokers: int) -> str | None:
    """The placer's refusal for a replication factor over `brokers` usable brokers, or None."""
    if replication_factor < 1:
        return f"Invalid replication factor {replication_factor}: the replication factor must be positive."
    if replication_factor > brokers:
        return (f"The target replication factor of {replication_factor} cannot be reached because only "
                f"{brokers} broker(s) are registered.")
    return None


def assign_replicas(
    brokers: Sequence[int],
    partitions: int,
    replication_factor: int,
    start_index: int | None = None,
    first_partition: int = 0,
    replica_shift: int | None = None,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Kafka's rack-unaware assignment of partitions first_partition .. first_partition + partitions - 1.

    With `start_index` given and `replica_shift` not, the shift starts at `start_index` too (Kafka's
    fixedStartIndex). Raises PlacementError(INVALID_REPLICATION_FACTOR) when rf < 1 or rf > len(brokers).
    """
    ids = sorted(set(brokers))
    problem = replication_factor_problem(replication_factor, len(ids))
    if problem:
        raise PlacementError(ErrorCode.INVALID_REPLICATION_FACTOR, problem)
    if partitions < 0:
        raise PlacementError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be positive.")
    n = len(ids)
    rng = rng or random
    start = start_index if start_index is not None else rng.randrange(n)
    shift = replica_shift if replica_shift is not None else (start_index if start_index is not None
                                                            else rng.randrange(n))
    out: dict[int, list[int]] = {}
    for partition in range(max(0, first_partition), max(0, first_partition) + partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[(first + 1 + (shift + j) % (n - 1)) % n])
        out[partition] = replicas
    return out


def assign_new_partitions(
    brokers: Sequence[int],
    existing: Mapping[int, Sequence[int]],
    new_total: int,
) -> dict[int, list[int]]:
    """Placement of the partitions CreatePartitions adds, as Kafka's ZooKeeper-era controller does it.

    The replication factor is partition 0's, and the round robin resumes where partition 0's first replica
    sits among the live brokers, so added partitions continue the topic's pattern.
    """
    partition0 = list(existing[0])
    ids = sorted(set(brokers))
    start = next((i for i, b in enumerate(ids) if b >= partition0[0]), 0)
    return assign_replicas(ids, new_total - len(existing), len(partition0), start_index=start,
                           first_partition=len(existing))


def validate_replicas(replicas: Sequence[int], registered: Collection[int], replication_factor: int | None) -> None:
    """One partition's explicit replica list: not empty, registered brokers, each once, the topic's rf."""
    if not replicas:
        raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             "The manual partition assignment includes an empty replica list.")
    previous = None
    for broker in sorted(replicas):
        if broker not in registered:
            raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"The manual partition assignment includes broker {broker}, but no such broker "
                                 f"is registered.")
        if broker == previous:
            raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"The manual partition assignment includes the broker {broker} more than once.")
        previous = broker
    if replication_factor is not None and len(replicas) != replication_factor:
        raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"The manual partition assignment includes a partition with {len(replicas)} replica(s), "
                             f"but this is not consistent with previous partitions, which have "
                             f"{replication_factor} replica(s).")


def validate_assignment(
    assignment: Sequence[tuple[int, Sequence[int]]] | Mapping[int, Sequence[int]],
    registered: Collection[int],
    replication_factor: int | None = None,
    first_partition: int = 0,
) -> dict[int, list[int]]:
    """A whole explicit assignment (CreateTopics): every list valid, the same rf, partitions numbered
    first_partition, first_partition + 1, ... with none twice. Returns it as {partition: replicas}."""
    items = list(assignment.items()) if isinstance(assignment, Mapping) else list(assignment)
    out: dict[int, list[int]] = {}
    rf = replication_factor
    for partition, replicas in items:
        if partition in out:
            raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"Found multiple manual partition assignments for partition {partition}")
        validate_replicas(replicas, registered, rf)
        rf = len(replicas)
        out[partition] = list(replicas)
    if sorted(out) != list(range(first_partition, first_partition + len(out))):
        raise PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             "partitions should be a consecutive 0-based integer sequence")
    return out
