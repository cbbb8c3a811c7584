"""ConsumerProtocol bytes (checked against kafka-python's independent encoder) and the range/roundrobin plans."""

from __future__ import annotations

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KpAssignment
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KpSubscription

from oncelog.client.consumer.assignors import Member, RangeAssignor, RoundRobinAssignor, assignor_for
from oncelog.client.consumer.protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_matches_kafka_python_byte_for_byte(version):
    sub = Subscription(["b", "a"], b"ud", {"a": [0, 2]}, 5, "rack-1")
    theirs = KpSubscription(version=version, topics=["b", "a"], user_data=b"ud",
                            owned_partitions=[KpSubscription.TopicPartition(topic="a", partitions=[0, 2])],
                            generation_id=5, rack_id="rack-1").encode()
    assert encode_subscription(sub, version) == theirs
    decoded = decode_subscription(theirs)
    assert (decoded.topics, decoded.user_data) == (["b", "a"], b"ud")


def test_subscription_v1_to_v3_round_trip_and_unknown_tail_is_ignored():
    sub = Subscription(["t"], None, {"t": [0, 2]}, 5, "rack-1")
    for version in (1, 2, 3):
        decoded = decode_subscription(encode_subscription(sub, version))
        assert decoded.topics == ["t"] and decoded.owned_partitions == {"t": [0, 2]}
        assert decoded.generation_id == (5 if version >= 2 else -1)
        assert decoded.rack_id == ("rack-1" if version >= 3 else None)
    # a future version 9 that appends a field: read by its known prefix
    future = b"\x00\x09" + encode_subscription(sub, 3)[2:] + b"\x01\x02\x03"
    assert decode_subscription(future).topics == ["t"]


def test_assignment_matches_kafka_python_and_empty_is_nothing():
    ours = encode_assignment(Assignment({"t": [1, 3], "a": [0]}, None))
    decoded = KpAssignment.decode(ours)
    assert sorted((tp.topic, tp.partitions) for tp in decoded.assigned_partitions) == [("a", [0]), ("t", [1, 3])]
    theirs = KpAssignment(version=0, assigned_partitions=[KpAssignment.TopicPartition(topic="t", partitions=[4, 5])],
                          user_data=b"").encode()
    assert decode_assignment(theirs) == Assignment({"t": [4, 5]}, b"")
    assert decode_assignment(b"") == Assignment({})


def test_truncated_bytes_are_an_error():
    data = encode_subscription(Subscription(["topic"]))
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(data[:7])


def members(*specs: tuple[str, list[str]], static: dict[str, str] | None = None) -> list[Member]:
    static = static or {}
    return [Member(mid, static.get(mid), Subscription(topics)) for mid, topics in specs]


def plan(assignor, parts, ms) -> dict[str, dict[str, list[int]]]:
    return {mid: a.partitions for mid, a in assignor.assign(parts, ms).items()}


def test_range_gives_consecutive_ranges_extra_to_the_first_members():
    ms = members(("m-b", ["t", "u"]), ("m-a", ["t", "u"]), ("m-c", ["t"]))
    assert plan(RangeAssignor(), {"t": 7, "u": 3}, ms) == {
        "m-a": {"t": [0, 1, 2], "u": [0, 1]},
        "m-b": {"t": [3, 4], "u": [2]},
        "m-c": {"t": [5, 6]},
    }


def test_range_static_members_first_and_more_members_than_partitions():
    ms = members(("m-a", ["t"]), ("m-z", ["t"]), static={"m-z": "inst-1"})
    assert plan(RangeAssignor(), {"t": 1}, ms) == {"m-z": {"t": [0]}, "m-a": {}}


def test_roundrobin_deals_sorted_partitions_respecting_subscriptions():
    ms = members(("m-a", ["t", "u"]), ("m-b", ["t"]))
    assert plan(RoundRobinAssignor(), {"t": 3, "u": 2, "unsubscribed": 4}, ms) == {
        "m-a": {"t": [0, 2], "u": [0, 1]},
        "m-b": {"t": [1]},
    }


def test_every_partition_assigned_exactly_once():
    ms = members(*[(f"m{i}", ["a", "b", "c"]) for i in range(4)])
    parts = {"a": 5, "b": 1, "c": 9}
    for assignor in (RangeAssignor(), RoundRobinAssignor()):
        seen = sorted((t, p) for a in assignor.assign(parts, ms).values() for t, ps in a.partitions.items()
                      for p in ps)
        assert seen == sorted((t, p) for t, n in parts.items() for p in range(n))


def test_unknown_assignor_name():
    assert assignor_for("roundrobin").name == "roundrobin"
    with pytest.raises(ValueError, match="cooperative-sticky"):
        assignor_for("cooperative-sticky")
