"""CreateTopics and CreatePartitions plans: placements, initial states, and Kafka's refusals."""

from __future__ import annotations

import pytest

from oncelog.cluster.metadata_image import PartitionAssignment, TopicInfo
from oncelog.cluster.placement import PlacementError
from oncelog.cluster.topic_plans import NewTopic, plan_new_partitions, plan_new_topic, topic_collision
from oncelog.errors import ErrorCode

LIVE = [1, 2, 3]


def plan(topic, registered=LIVE, usable=LIVE, existing=(), partitions=1, rf=1):
    return plan_new_topic(topic, registered, usable, existing, partitions, rf)


def refused(call, *args, **kwargs):
    with pytest.raises(PlacementError) as caught:
        call(*args, **kwargs)
    return caught.value.code, caught.value.message


def test_defaults_and_initial_states():
    p = plan(NewTopic("t"), partitions=4, rf=3)
    assert sorted(p.assignment) == [0, 1, 2, 3] and p.replication_factor == 3
    for part, replicas in p.assignment.items():
        assert p.initial[part] == (replicas[0], replicas)


def test_brokers_shutting_down_are_not_placed_on_nor_lead():
    p = plan(NewTopic("t", 6, 2), usable=[1, 3])
    assert all(set(r) == {1, 3} for r in p.assignment.values())
    p = plan(NewTopic("t", assignments={0: [2, 1]}), usable=[1, 3])
    assert p.initial == {0: (1, [1])}
    assert refused(plan, NewTopic("t", assignments={0: [2]}), usable=[1, 3]) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "All brokers specified in the manual partition assignment for partition 0 are fenced or in controlled "
        "shutdown.")


@pytest.mark.parametrize("topic,code,message", [
    (NewTopic("t", 1, 4), ErrorCode.INVALID_REPLICATION_FACTOR,
     "Unable to replicate the partition 4 time(s): The target replication factor of 4 cannot be reached because "
     "only 3 broker(s) are registered."),
    (NewTopic("t", 1, 0), ErrorCode.INVALID_REPLICATION_FACTOR,
     "Replication factor must be larger than 0, or -1 to use the default value."),
    (NewTopic("t", 0, 1), ErrorCode.INVALID_PARTITIONS,
     "Number of partitions was set to an invalid non-positive value."),
    (NewTopic("t", 2, -1, assignments={0: [1]}), ErrorCode.INVALID_REQUEST,
     "A manual partition assignment was specified, but numPartitions was not set to -1."),
    (NewTopic("t", -1, 1, assignments={0: [1]}), ErrorCode.INVALID_REQUEST,
     "A manual partition assignment was specified, but replication factor was not set to -1."),
    (NewTopic("t", assignments={0: [1, 1]}), ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes the broker 1 more than once."),
    (NewTopic("t", assignments={0: [1, 7]}), ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes broker 7, but no such broker is registered."),
    (NewTopic("t", assignments={0: [1, 2], 1: [3]}), ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes a partition with 1 replica(s), but this is not consistent with "
     "previous partitions, which have 2 replica(s)."),
    (NewTopic("t", assignments={1: [1]}), ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "partitions should be a consecutive 0-based integer sequence"),
    (NewTopic("bad name"), ErrorCode.INVALID_TOPIC_EXCEPTION, None),
    (NewTopic("t", configs={"no.such.key": "1"}), ErrorCode.INVALID_CONFIG, "Unknown topic config name: no.such.key"),
])
def test_create_topic_refusals(topic, code, message):
    got_code, got_message = refused(plan, topic)
    assert got_code == code
    if message is not None:
        assert got_message == message


def test_existing_and_colliding_names():
    assert refused(plan, NewTopic("a.b"), existing=["a.b"]) == (ErrorCode.TOPIC_ALREADY_EXISTS,
                                                               "Topic 'a.b' already exists.")
    assert refused(plan, NewTopic("a.b"), existing=["a_b"]) == (ErrorCode.INVALID_TOPIC_EXCEPTION,
                                                               "Topic 'a.b' collides with existing topic: a_b")
    assert topic_collision("ab", ["ab"]) is None


def _info(parts=3, rf=2, reassigning=False):
    assignment = {p: PartitionAssignment(tuple(LIVE[(p + i) % 3] for i in range(rf))) for p in range(parts)}
    if reassigning:
        assignment[0] = PartitionAssignment((1, 2, 3), adding=(3,))
    return TopicInfo("t", b"x" * 16, assignment, 4, 1)


def test_create_partitions_places_like_the_topic():
    p = plan_new_partitions(_info(), 6, None, LIVE, LIVE)
    assert sorted(p.assignment) == [3, 4, 5] and all(len(set(r)) == 2 for r in p.assignment.values())
    p = plan_new_partitions(_info(), 5, [[3, 1], [2, 3]], LIVE, LIVE)
    assert p.assignment == {3: [3, 1], 4: [2, 3]} and p.initial == {3: (3, [3, 1]), 4: (2, [2, 3])}


@pytest.mark.parametrize("count,assignments,code,message", [
    (2, None, ErrorCode.INVALID_PARTITIONS, "The topic t currently has 3 partition(s); 2 would not be an increase."),
    (-22, None, ErrorCode.INVALID_PARTITIONS,
     "The topic t currently has 3 partition(s); -22 would not be an increase."),
    (3, None, ErrorCode.INVALID_PARTITIONS, "Topic already has 3 partition(s)."),
    (6, [[1, 2]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "Attempted to add 3 additional partition(s), but only 1 assignment(s) were specified."),
    (4, [[1, 2, 3]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes a partition with 3 replica(s), but this is not consistent with "
     "previous partitions, which have 2 replica(s)."),
    (4, [[12, 1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes broker 12, but no such broker is registered."),
    (4, [[1, 1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT,
     "The manual partition assignment includes the broker 1 more than once."),
])
def test_create_partitions_refusals(count, assignments, code, message):
    assert refused(plan_new_partitions, _info(), count, assignments, LIVE, LIVE) == (code, message)


def test_create_partitions_refused_during_reassignment_or_without_enough_brokers():
    assert refused(plan_new_partitions, _info(reassigning=True), 4, None, LIVE, LIVE)[0] == \
        ErrorCode.REASSIGNMENT_IN_PROGRESS
    assert refused(plan_new_partitions, _info(rf=3), 4, None, LIVE, [1, 2]) == (
        ErrorCode.INVALID_REPLICATION_FACTOR,
        "The target replication factor of 3 cannot be reached because only 2 broker(s) are registered.")
