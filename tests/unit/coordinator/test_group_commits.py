"""Committed offsets on an in-memory offsets log: who may commit, durability, transactional offsets,
replay after a restart (markers honoured), retention, deletion."""

from __future__ import annotations

import asyncio

from tests.unit.coordinator.group_helpers import (
    Clock,
    FakeLog,
    commit_items,
    coordinator,
    join_new,
    run,
    subscription,
)

from oncelog.coordinator.group.api import LeavingMember, OffsetCommitItem
from oncelog.coordinator.group.group import GroupState
from oncelog.coordinator.group.records import GroupKey, OffsetKey, decode_key
from oncelog.errors import ErrorCode as E


async def started(log: FakeLog | None = None, clock: Clock | None = None, **kwargs):
    c = coordinator(log, clock, **kwargs)
    c.startup()
    c.start()
    return c


def offsets_of(c, group: str, *tps, stable: bool = False):
    error, fetched = c.fetch_offsets(group, list(tps) if tps else None, stable)
    assert error == E.NONE
    return {(f.topic, f.partition): (f.offset, f.error) for f in fetched}


def test_simple_commit_without_group_management():
    async def body():
        c = await started()
        errors = await c.commit_offsets("simple", -1, "", None, commit_items(("t", 0, 10), ("t", 1, 20)))
        assert errors == [E.NONE, E.NONE]
        assert offsets_of(c, "simple") == {("t", 0): (10, E.NONE), ("t", 1): (20, E.NONE)}
        assert offsets_of(c, "simple", ("t", 2)) == {("t", 2): (-1, E.NONE)}
        assert offsets_of(c, "unknown", ("t", 0)) == {("t", 0): (-1, E.NONE)}
        assert offsets_of(c, "unknown") == {}
        assert c.groups["simple"].protocol_type is None
        await c.stop()

    run(body)


def test_commit_validation():
    async def body():
        c = await started()
        assert await c.commit_offsets("nogroup", 3, "m", None, commit_items(("t", 0, 1))) == [E.ILLEGAL_GENERATION]
        a = await join_new(c, "g")
        items = commit_items(("t", 0, 5))
        # the member has its generation but not its assignment yet
        assert await c.commit_offsets("g", 1, a.member_id, None, items) == [E.REBALANCE_IN_PROGRESS]
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        assert await c.commit_offsets("g", 1, a.member_id, None, items) == [E.NONE]
        assert await c.commit_offsets("g", 0, a.member_id, None, items) == [E.ILLEGAL_GENERATION]
        assert await c.commit_offsets("g", 1, "ghost", None, items) == [E.UNKNOWN_MEMBER_ID]
        assert await c.commit_offsets("g", -1, "", None, items) == [E.UNKNOWN_MEMBER_ID]  # group is not empty
        mixed = [OffsetCommitItem("t", 1, 1, -1, "x" * 5000), OffsetCommitItem("missing", 0, 1),
                 OffsetCommitItem("t", 2, 7, 3, "meta")]
        assert await c.commit_offsets("g", 1, a.member_id, None, mixed) == [
            E.OFFSET_METADATA_TOO_LARGE, E.UNKNOWN_TOPIC_OR_PARTITION, E.NONE]
        _, fetched = c.fetch_offsets("g", [("t", 2)])
        assert (fetched[0].offset, fetched[0].leader_epoch, fetched[0].metadata) == (7, 3, "meta")
        await c.stop()

    run(body)


def test_commit_is_visible_only_once_durable_and_failures_are_mapped():
    async def body():
        log = FakeLog()
        c = await started(log)
        log.gate = asyncio.Event()
        task = asyncio.create_task(c.commit_offsets("g", -1, "", None, commit_items(("t", 0, 10))))
        await asyncio.sleep(0.01)
        assert offsets_of(c, "g", ("t", 0), stable=True) == {("t", 0): (-1, E.UNSTABLE_OFFSET_COMMIT)}
        assert offsets_of(c, "g", ("t", 0)) == {("t", 0): (-1, E.NONE)}
        log.gate.set()
        assert await task == [E.NONE]
        assert offsets_of(c, "g", ("t", 0), stable=True) == {("t", 0): (10, E.NONE)}
        log.fail_durable = E.KAFKA_STORAGE_ERROR
        assert await c.commit_offsets("g", -1, "", None, commit_items(("t", 0, 11))) == [E.NOT_COORDINATOR]
        assert offsets_of(c, "g", ("t", 0)) == {("t", 0): (10, E.NONE)}
        log.fail_durable = None
        log.fail_append = E.RECORD_LIST_TOO_LARGE
        assert await c.commit_offsets("g", -1, "", None, commit_items(("t", 0, 12))) == [E.INVALID_COMMIT_OFFSET_SIZE]
        await c.stop()

    run(body)


def test_transactional_offsets_pending_until_commit_marker():
    async def body():
        c = await started()
        await c.commit_offsets("g", -1, "", None, commit_items(("t", 0, 5)))
        error = await c.stage_txn_offsets("g", 1000, 0, [("t", 0, 50, "", -1), ("t", 1, 60, None, -1)])
        assert error == E.NONE
        assert offsets_of(c, "g", ("t", 0), ("t", 1)) == {("t", 0): (5, E.NONE), ("t", 1): (-1, E.NONE)}
        assert offsets_of(c, "g", ("t", 0), ("t", 1), stable=True) == {
            ("t", 0): (-1, E.UNSTABLE_OFFSET_COMMIT), ("t", 1): (-1, E.UNSTABLE_OFFSET_COMMIT)}
        assert c.has_pending_txn_offsets("g", "t", 1)
        assert c.complete_txn(1000, True, partition=c.partition_for("g") + 1) == 0  # another partition's marker
        assert c.complete_txn(1000, True, partition=c.partition_for("g")) == 2
        assert offsets_of(c, "g", stable=True) == {("t", 0): (50, E.NONE), ("t", 1): (60, E.NONE)}
        assert c.complete_txn(1000, True) == 0  # idempotent: the coordinator may retry the marker
        await c.stop()

    run(body)


def test_transactional_offsets_dropped_on_abort():
    async def body():
        c = await started()
        assert await c.stage_txn_offsets("g", 7, 0, [("t", 0, 50, "", -1)]) == E.NONE
        assert c.complete_txn(7, False) == 0
        assert offsets_of(c, "g", ("t", 0), stable=True) == {("t", 0): (-1, E.NONE)}
        await c.stop()

    run(body)


def test_txn_commit_checks_member_and_generation_when_given():
    async def body():
        c = await started()
        a = await join_new(c, "g")
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        offsets = [("t", 0, 1, "", -1)]
        assert await c.stage_txn_offsets("g", 1, 0, offsets, generation_id=1, member_id="ghost") \
            == E.UNKNOWN_MEMBER_ID
        assert await c.stage_txn_offsets("g", 1, 0, offsets, generation_id=5, member_id=a.member_id) \
            == E.ILLEGAL_GENERATION
        assert await c.stage_txn_offsets("g", 1, 0, offsets) == E.NONE  # old clients send neither
        assert await c.stage_txn_offsets("g", 1, 0, [("t", 0, 1, "x" * 5000, -1)]) == E.OFFSET_METADATA_TOO_LARGE
        assert await c.stage_txn_offsets("g", 1, 0, [("missing", 0, 1, "", -1)]) == E.UNKNOWN_TOPIC_OR_PARTITION
        assert await c.stage_txn_offsets("", 1, 0, offsets) == E.INVALID_GROUP_ID
        await c.stop()

    run(body)


def test_failed_txn_write_is_not_left_pending():
    async def body():
        log = FakeLog()
        c = await started(log)
        log.fail_durable = E.NOT_ENOUGH_REPLICAS
        assert await c.stage_txn_offsets("g", 9, 0, [("t", 0, 1, "", -1)]) == E.COORDINATOR_NOT_AVAILABLE
        assert not c.has_pending_txn_offsets("g", "t", 0) and 9 not in c.offsets.producer_groups
        await c.stop()

    run(body)


def test_restart_replays_offsets_and_honours_markers():
    async def body():
        log = FakeLog()
        c = await started(log)
        part = c.partition_for("g")
        await c.commit_offsets("g", -1, "", None, commit_items(("t", 0, 1), ("t", 1, 1), ("t", 2, 1)))
        await c.stage_txn_offsets("g", 100, 0, [("t", 0, 10, "", -1)])  # committed below
        await c.stage_txn_offsets("g", 200, 0, [("t", 1, 20, "", -1)])  # aborted below
        await c.stage_txn_offsets("g", 300, 0, [("t", 2, 30, "", -1)])  # still open at the restart
        await c.stage_txn_offsets("g", 400, 0, [("t", 3, 40, "", -1)])  # committed, but a plain commit follows
        await c.commit_offsets("g", -1, "", None, commit_items(("t", 3, 41)))
        log.marker(part, 100, True)
        log.marker(part, 200, False)
        log.marker(part, 400, True)
        await c.stop()

        c2 = await started(log)
        assert offsets_of(c2, "g") == {("t", 0): (10, E.NONE), ("t", 1): (1, E.NONE), ("t", 2): (1, E.NONE),
                                       ("t", 3): (41, E.NONE)}
        assert offsets_of(c2, "g", ("t", 2), stable=True) == {("t", 2): (-1, E.UNSTABLE_OFFSET_COMMIT)}
        assert c2.offsets.producer_groups == {300: {"g"}}
        assert c2.complete_txn(300, True, part) == 1  # the transaction coordinator finishes it after its restart
        assert offsets_of(c2, "g", ("t", 2), stable=True) == {("t", 2): (30, E.NONE)}
        await c2.stop()

    run(body)


def test_offsets_of_an_empty_group_expire_after_retention():
    async def body():
        log = FakeLog()
        clock = Clock()
        c = await started(log, clock, offsets_retention_ms=60_000)
        a = await join_new(c, "g")
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        await c.commit_offsets("g", 1, a.member_id, None, commit_items(("t", 0, 5)))
        await c.commit_offsets("simple", -1, "", None, commit_items(("t", 0, 6)))
        clock.now += 120_000
        assert c.expire_offsets() == 1  # only the simple group's: g is Stable and subscribed to t
        assert "simple" not in c.groups
        c.leave_group("g", [LeavingMember(a.member_id)])
        assert c.groups["g"].state is GroupState.EMPTY
        clock.now += 59_000
        assert c.expire_offsets() == 0  # counted from when the group became empty
        clock.now += 2_000
        assert c.expire_offsets() == 1
        assert "g" not in c.groups
        tombstones = [(decode_key(r.key), r.value) for r in log.records() if r.value is None]
        assert (OffsetKey("g", "t", 0), None) in tombstones and (GroupKey("g"), None) in tombstones
        assert (OffsetKey("simple", "t", 0), None) in tombstones
        assert (GroupKey("simple"), None) not in tombstones  # it never had group metadata
        await c.stop()
        c2 = await started(log)
        assert c2.groups == {}
        await c2.stop()

    run(body)


def test_stable_group_expires_offsets_of_topics_it_no_longer_reads():
    async def body():
        clock = Clock()
        c = await started(clock=clock, offsets_retention_ms=1000)
        a = await join_new(c, "g", protocols=[("range", subscription("t"))])
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        await c.commit_offsets("g", 1, a.member_id, None, commit_items(("t", 0, 1), ("old", 0, 2)))
        clock.now += 2000
        assert c.expire_offsets() == 1
        assert offsets_of(c, "g") == {("t", 0): (1, E.NONE)}
        await c.stop()

    run(body)


def test_delete_groups():
    async def body():
        log = FakeLog()
        c = await started(log)
        a = await join_new(c, "active")
        await c.commit_offsets("simple", -1, "", None, commit_items(("t", 0, 1)))
        await c.stage_txn_offsets("simple", 5, 0, [("t", 1, 1, "", -1)])
        results = await c.delete_groups(["active", "simple", "nope"])
        assert results == {"active": E.NON_EMPTY_GROUP, "simple": E.NONE, "nope": E.GROUP_ID_NOT_FOUND}
        assert "simple" not in c.groups and 5 not in c.offsets.producer_groups
        assert offsets_of(c, "simple", ("t", 0)) == {("t", 0): (-1, E.NONE)}
        assert a.member_id in c.groups["active"].members
        await c.stop()
        c2 = await started(log)
        assert "simple" not in c2.groups or not c2.groups["simple"].offsets.committed
        await c2.stop()

    run(body)


def test_offset_delete():
    async def body():
        c = await started()
        a = await join_new(c, "g", protocols=[("range", subscription("t"))])
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        await c.commit_offsets("g", 1, a.member_id, None, commit_items(("t", 0, 1), ("u", 0, 2)))
        error, errors = await c.delete_offsets("g", [("t", 0), ("u", 0), ("missing", 0)])
        assert error == E.NONE
        assert errors == [E.GROUP_SUBSCRIBED_TO_TOPIC, E.NONE, E.UNKNOWN_TOPIC_OR_PARTITION]
        assert offsets_of(c, "g") == {("t", 0): (1, E.NONE)}
        assert await c.delete_offsets("nope", [("t", 0)]) == (E.GROUP_ID_NOT_FOUND, [])
        other = await join_new(c, "connect-group", protocol_type="connect")
        assert other.error == E.NONE
        assert await c.delete_offsets("connect-group", [("t", 0)]) == (E.NON_EMPTY_GROUP, [])
        await c.commit_offsets("simple", -1, "", None, commit_items(("t", 0, 1)))
        assert await c.delete_offsets("simple", [("t", 0)]) == (E.NONE, [E.NONE])
        assert "simple" not in c.groups  # nothing left: the group is gone
        await c.stop()

    run(body)


def test_metrics_count_groups_rebalances_and_commits():
    async def body():
        c = await started()
        a = await join_new(c, "g")
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        await c.commit_offsets("g", 1, a.member_id, None, commit_items(("t", 0, 1), ("t", 1, 1)))
        registry = c.metrics.registry
        assert registry.get_sample_value("oncelog_groups", {"state": "Stable"}) == 1
        assert registry.get_sample_value("oncelog_group_rebalances_total") == 1
        assert registry.get_sample_value("oncelog_offset_commits_total", {"kind": "consumer"}) == 2
        await c.stop()

    run(body)
