"""The metadata image: applies only newer values, and reports each change once."""

from __future__ import annotations

import uuid

from oncelog.cluster.metadata_image import (
    NO_CONTROLLER,
    BrokerInfo,
    ImageDelta,
    MetadataImage,
    PartitionAssignment,
    PartitionState,
    TopicDeletion,
    TopicInfo,
)


def _topic(name="t", parts=2, version=0, created=10, replicas=(1, 2, 3), topic_id=None):
    return TopicInfo(name, topic_id or uuid.uuid4().bytes,
                     {p: PartitionAssignment(tuple(replicas)) for p in range(parts)}, version, created)


def _state(leader=1, epoch=0, isr=(1, 2, 3), version=0):
    return PartitionState(leader, epoch, tuple(isr), 1, version)


def _recording(image):
    deltas: list[ImageDelta] = []
    image.subscribe(deltas.append)
    return deltas


def test_broker_registrations_are_ordered_by_epoch():
    image = MetadataImage()
    deltas = _recording(image)
    assert image.apply_broker(BrokerInfo(1, "h", 9092, None, 100))
    assert deltas[-1].brokers_added == {1}
    assert not image.apply_broker(BrokerInfo(1, "h", 9092, None, 100))      # same: no event
    assert not image.apply_broker(BrokerInfo(1, "h", 9093, None, 50))       # older incarnation
    assert image.brokers[1].epoch == 100
    assert not image.remove_broker(1, epoch=50)                             # removal of an older incarnation
    assert image.apply_broker(BrokerInfo(1, "h", 9094, None, 200))          # restart: new epoch
    assert deltas[-1].brokers_added == {1}
    assert image.remove_broker(1)
    assert deltas[-1].brokers_removed == {1} and not image.is_live(1)
    assert len(deltas) == 3


def test_full_broker_list_replaces_in_one_event():
    image = MetadataImage()
    image.apply_brokers([BrokerInfo(i, "h", 9000 + i, None, i) for i in (1, 2, 3)])
    deltas = _recording(image)
    assert image.apply_brokers([BrokerInfo(2, "h", 9002, None, 2), BrokerInfo(4, "h", 9004, None, 4)])
    assert sorted(image.brokers) == [2, 4]
    assert len(deltas) == 1
    assert deltas[0].brokers_removed == {1, 3} and deltas[0].brokers_added == {4}


def test_controller_epoch_never_goes_back():
    image = MetadataImage()
    assert image.apply_controller(1, 5)
    assert not image.apply_controller(2, 4)
    assert image.apply_controller(NO_CONTROLLER, 5)
    assert image.apply_controller(2, 6)
    assert (image.controller_id, image.controller_epoch) == (2, 6)


def test_partition_state_versions_only_go_up():
    image = MetadataImage()
    assert not image.apply_partition_state("t", 0, _state())                  # unknown topic: read it first
    image.apply_topic(_topic())
    deltas = _recording(image)
    assert image.apply_partition_state("t", 0, _state(version=3), created=11)
    assert not image.apply_partition_state("t", 0, _state(leader=2, version=2), created=11)
    assert image.partition("t", 0).version == 3
    assert image.apply_partition_state("t", 0, _state(leader=2, epoch=1, isr=(2, 3), version=4), created=11)
    assert not image.apply_partition_state("t", 5, _state())                  # no such partition
    assert [d.partitions for d in deltas] == [{("t", 0)}, {("t", 0)}]
    assert image.led_by(2) == [("t", 0)]


def test_recreated_topic_replaces_old_incarnation_and_its_states():
    image = MetadataImage()
    old = _topic(version=3, created=10)
    image.apply_topic(old)
    image.apply_partition_state("t", 0, _state(version=7), created=11)
    image.apply_topic_configs("t", {"retention.ms": "1"}, version=2, created=12)
    deltas = _recording(image)
    new = _topic(version=0, created=50, parts=1)
    assert image.apply_topic(new)
    assert image.topics["t"].topic_id == new.topic_id
    assert image.partition("t", 0) is None and "t" not in image.topic_configs
    assert image.apply_partition_state("t", 0, _state(version=0), created=51)   # version restarts at 0: newer
    assert not image.apply_topic(old)                                          # a late read of the old one
    assert not image.remove_topic("t", created=10)                             # removal of the old one
    d = deltas[0]
    assert d.topics_removed == {"t"} and d.topics_added == {"t"} and ("t", 1) in d.partitions


def test_assignment_change_reports_only_changed_partitions():
    image = MetadataImage()
    info = _topic(parts=3)
    image.apply_topic(info)
    deltas = _recording(image)
    assignment = dict(info.assignment)
    assignment[1] = PartitionAssignment((1, 2, 3, 4), adding=(4,))
    assert image.apply_topic(TopicInfo("t", info.topic_id, assignment, 1, info.created))
    assert deltas[-1].partitions == {("t", 1)} and not deltas[-1].topics_added
    assert image.assignment("t", 1).reassigning and image.assignment("t", 1).original == (1, 2, 3)
    assert image.replicas_on(4) == [("t", 1)]


def test_topic_removal_drops_everything_of_it():
    image = MetadataImage()
    image.apply_topic(_topic(parts=2))
    image.apply_topic(_topic(name="u", parts=1))
    for p in range(2):
        image.apply_partition_state("t", p, _state())
    image.apply_topic_configs("t", {"a": "b"}, 0)
    deltas = _recording(image)
    assert image.retain_topics(["u"])
    assert set(image.topics) == {"u"} and not any(k[0] == "t" for k in image.states)
    assert len(deltas) == 1
    assert deltas[0].topics_removed == {"t"} and deltas[0].configs == {"t"}
    assert deltas[0].partitions == {("t", 0), ("t", 1)}


def test_configs_and_deletions_are_versioned():
    image = MetadataImage()
    image.apply_topic(_topic())
    assert image.apply_topic_configs("t", {"a": "1"}, 2)
    assert not image.apply_topic_configs("t", {"a": "0"}, 1)
    assert image.topic_configs["t"] == {"a": "1"}
    d = TopicDeletion("x", {b"1" * 16: (1, 2)}, 0, 5)
    assert image.apply_deletion(d)
    assert not image.apply_deletion(TopicDeletion("x", {b"1" * 16: (1, 2, 3)}, 0, 4))
    assert image.apply_deletion(TopicDeletion("x", {b"1" * 16: (2,)}, 1, 5))
    assert image.retain_deletions([]) and not image.deleting


def test_a_newer_config_version_with_the_same_overrides_is_reported_once():
    # A write that deleted a key nobody had set leaves the overrides as they were, but the version moved: a
    # broker waiting for its image to show the write is told. Reading the same version again tells nobody.
    image = MetadataImage()
    image.apply_topic(_topic())
    assert image.apply_topic_configs("t", {"a": "1"}, 2)
    deltas = _recording(image)
    assert image.apply_topic_configs("t", {"a": "1"}, 3)
    assert image.config_version("t") == 3 and [d.configs for d in deltas] == [{"t"}]
    assert not image.apply_topic_configs("t", {"a": "1"}, 3)
    assert not image.apply_topic_configs("t", {"a": "1"}, 2)
    assert len(deltas) == 1 and image.config_version("t") == 3


def test_batch_delivers_one_delta_and_listener_errors_do_not_stop_others():
    image = MetadataImage()
    seen: list[ImageDelta] = []

    def broken(delta):
        raise RuntimeError("listener bug")

    image.subscribe(broken)
    image.subscribe(seen.append)
    with image.batch():
        image.apply_broker(BrokerInfo(1, "h", 1, None, 1))
        image.apply_controller(1, 1)
        image.apply_topic(_topic())
    assert len(seen) == 1
    assert seen[0].brokers_changed and seen[0].controller_changed and seen[0].topics_added == {"t"}
    with image.batch():
        image.apply_controller(1, 1)                  # nothing changed: nothing delivered
    assert len(seen) == 1
