"""The znode values of cluster metadata (cluster/store/znodes.py), without ZooKeeper: every codec reads back what
it wrote, reads values an older writer left (fields missing), and keeps Kafka's topic-id form."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest

from oncelog.cluster.metadata_image import PartitionAssignment, PartitionState
from oncelog.cluster.store import znodes


def stat(version: int = 7, czxid: int = 99) -> SimpleNamespace:
    return SimpleNamespace(version=version, czxid=czxid)


def test_partition_state_round_trip_takes_the_version_from_the_stat():
    state = PartitionState(2, 5, (2, 1, 3), 4, 0, log_start_floor=120)
    back = znodes.state_from(znodes.state_json(state), stat(version=11))
    assert back == PartitionState(2, 5, (2, 1, 3), 4, 11, log_start_floor=120)
    assert json.loads(znodes.state_json(state))["version"] == znodes.FORMAT_VERSION


def test_partition_state_of_an_older_writer_defaults_what_it_lacks():
    old = json.dumps({"version": 1, "leader": 1, "leader_epoch": 0, "isr": [1]}).encode()
    assert znodes.state_from(old, stat(version=3)) == PartitionState(1, 0, (1,), 0, 3, 0)


def test_topic_round_trip_with_a_reassignment_and_the_creating_mark():
    topic_id = uuid.uuid4().bytes
    assignment = {0: PartitionAssignment((1, 2, 3)), 1: PartitionAssignment((3, 4, 1, 2), adding=(4,), removing=(2,))}
    data = znodes.topic_json(topic_id, assignment, creating=True)
    assert znodes.creating(data) and not znodes.creating(znodes.topic_json(topic_id, assignment))
    info = znodes.topic_from("t", data, stat(version=2, czxid=42))
    assert (info.name, info.topic_id, info.assignment, info.version, info.created) == ("t", topic_id, assignment, 2, 42)


def test_deletion_round_trip():
    a, b = uuid.uuid4().bytes, uuid.uuid4().bytes
    back = znodes.deletion_from("t", znodes.deletion_json({a: [3, 1, 1], b: []}), stat(version=1, czxid=5))
    assert back.pending == {a: (1, 3), b: ()} and (back.version, back.created) == (1, 5)


@pytest.mark.parametrize("raw", [bytes(16), b"\xff" * 16, uuid.uuid4().bytes])
def test_topic_ids_in_kafkas_uuid_form(raw):
    text = znodes.encode_topic_id(raw)
    assert len(text) == 22 and "=" not in text and znodes.decode_topic_id(text) == raw


def test_a_value_that_is_not_an_object_is_refused():
    with pytest.raises(ValueError):
        znodes.load(b"[1, 2]")
    assert znodes.load(None) == {}


def test_paths():
    assert znodes.topic_path("orders") == "/topics/orders"
    assert znodes.state_path("orders", 3) == "/topics/orders/partitions/3/state"
    assert znodes.as_assignment([1, 2]) == PartitionAssignment((1, 2))
