"""Replica placement: Kafka's rack-unaware assignment and its checks of explicit assignments."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from oncelog.cluster.placement import (
    PlacementError,
    assign_new_partitions,
    assign_replicas,
    validate_assignment,
    validate_replicas,
)
from oncelog.errors import ErrorCode


def test_matches_kafkas_documented_layout_for_five_brokers():
    # The example in Kafka's AdminUtils docs: 5 brokers, 10 partitions, rf 3, start index 0 and shift 0.
    got = assign_replicas([0, 1, 2, 3, 4], 10, 3, start_index=0, replica_shift=0)
    firsts = {p: r[0] for p, r in got.items()}
    assert firsts == {p: p % 5 for p in range(10)}
    # second replicas: p0..p4 one broker to the right, p5..p9 two to the right (the shift grew by one)
    assert [got[p][1] for p in range(5)] == [1, 2, 3, 4, 0]
    assert [got[p][1] for p in range(5, 10)] == [2, 3, 4, 0, 1]
    assert [got[p][2] for p in range(5)] == [2, 3, 4, 0, 1]
    assert [got[p][2] for p in range(5, 10)] == [3, 4, 0, 1, 2]


@pytest.mark.parametrize("brokers,partitions,rf", [(3, 6, 3), (3, 30, 2), (5, 50, 3), (4, 8, 1), (1, 3, 1)])
def test_leaders_and_replicas_spread_evenly(brokers, partitions, rf):
    ids = [10 * i + 1 for i in range(brokers)]          # ids need not be 0..n-1
    for seed in range(20):
        got = assign_replicas(ids, partitions, rf, rng=random.Random(seed))
        assert sorted(got) == list(range(partitions))
        for replicas in got.values():
            assert len(replicas) == rf == len(set(replicas))
            assert set(replicas) <= set(ids)
        leaders = Counter(r[0] for r in got.values())
        assert max(leaders.values()) - min(leaders.get(b, 0) for b in ids) <= 1
        load = Counter(b for r in got.values() for b in r)
        assert max(load.values()) - min(load.get(b, 0) for b in ids) <= 1


def test_random_start_varies_between_topics():
    starts = {assign_replicas([1, 2, 3], 1, 1, rng=random.Random(seed))[0][0] for seed in range(50)}
    assert starts == {1, 2, 3}


def test_brokers_are_taken_in_id_order():
    assert assign_replicas([3, 1, 2], 3, 1, start_index=0) == {0: [1], 1: [2], 2: [3]}


@pytest.mark.parametrize("rf,brokers,message", [
    (4, 3, "The target replication factor of 4 cannot be reached because only 3 broker(s) are registered."),
    (0, 3, "Invalid replication factor 0: the replication factor must be positive."),
    (1, 0, "The target replication factor of 1 cannot be reached because only 0 broker(s) are registered."),
])
def test_replication_factor_refused(rf, brokers, message):
    with pytest.raises(PlacementError) as caught:
        assign_replicas(list(range(brokers)), 3, rf)
    assert caught.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert caught.value.message == message


def test_new_partitions_continue_the_topics_pattern():
    existing = assign_replicas([1, 2, 3], 3, 2, start_index=1)
    added = assign_new_partitions([1, 2, 3], existing, 6)
    assert sorted(added) == [3, 4, 5]
    assert all(len(r) == 2 == len(set(r)) for r in added.values())
    # start index = position of partition 0's first replica among the brokers, as Kafka computes it
    assert added == assign_replicas([1, 2, 3], 3, 2, start_index=1, first_partition=3)
    leaders = Counter(r[0] for r in {**existing, **added}.values())
    assert set(leaders.values()) == {2}


def test_new_partitions_when_first_replica_is_gone():
    added = assign_new_partitions([1, 2], {0: [3, 1]}, 2)
    assert added == {1: [2, 1]}


@pytest.mark.parametrize("replicas,rf,message", [
    ([], None, "The manual partition assignment includes an empty replica list."),
    ([1, 9], None, "The manual partition assignment includes broker 9, but no such broker is registered."),
    ([2, 1, 2], None, "The manual partition assignment includes the broker 2 more than once."),
    ([1, 2], 1, "The manual partition assignment includes a partition with 2 replica(s), but this is not "
                "consistent with previous partitions, which have 1 replica(s)."),
])
def test_explicit_replicas_refused_with_kafkas_messages(replicas, rf, message):
    with pytest.raises(PlacementError) as caught:
        validate_replicas(replicas, {1, 2, 3}, rf)
    assert caught.value.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert caught.value.message == message


def test_explicit_assignment_checks_partition_numbers_and_rf():
    assert validate_assignment({0: [1, 2], 1: [2, 3]}, {1, 2, 3}) == {0: [1, 2], 1: [2, 3]}
    for bad in ({1: [1], 2: [2]}, {0: [1], 2: [2]}):
        with pytest.raises(PlacementError, match="consecutive 0-based"):
            validate_assignment(bad, {1, 2})
    with pytest.raises(PlacementError, match="multiple manual partition assignments for partition 0"):
        validate_assignment([(0, [1]), (0, [2])], {1, 2})
    with pytest.raises(PlacementError, match="with 2 replica"):
        validate_assignment({0: [1], 1: [1, 2]}, {1, 2})
    assert validate_assignment({3: [1], 4: [2]}, {1, 2}, replication_factor=1, first_partition=3) == {3: [1], 4: [2]}
