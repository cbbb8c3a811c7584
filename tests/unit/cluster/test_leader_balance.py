"""The automatic leader balance's decision (leader_balance.py), without ZooKeeper: which partitions count toward a
broker's imbalance, where the threshold lies, and which preferred replicas may take their leadership back."""

from __future__ import annotations

from oncelog.cluster.leader_balance import imbalance, plan_rebalance
from oncelog.cluster.metadata_image import NO_LEADER, PartitionAssignment, PartitionState

ALL = {1, 2, 3}


def part(p, replicas, leader, isr=None, topic="t", adding=(), removing=()):
    """((topic, p), assignment, state); leader None: no state yet."""
    a = PartitionAssignment(tuple(replicas), tuple(adding), tuple(removing))
    s = None if leader is None else PartitionState(leader, 4, tuple(replicas if isr is None else isr), 1, 7)
    return (topic, p), a, s


def group(n_preferred_1, led_elsewhere, isr=None):
    """`n_preferred_1` partitions preferring broker 1, the first `led_elsewhere` of them led by broker 2."""
    return [part(p, (1, 2, 3), 2 if p < led_elsewhere else 1, isr) for p in range(n_preferred_1)]


def test_balanced_cluster_elects_nothing():
    parts = [part(0, (1, 2, 3), 1), part(1, (2, 3, 1), 2), part(2, (3, 1, 2), 3)]
    plan = plan_rebalance(parts, ALL, (), 10)
    assert plan.elect == () and plan.waiting == ()
    assert {b: (g.preferred, g.elsewhere) for b, g in plan.brokers.items()} == {1: (1, ()), 2: (1, ()), 3: (1, ())}
    assert plan_rebalance([], ALL, (), 0).elect == ()


def test_after_a_restart_every_leadership_of_the_returned_broker_comes_back():
    # broker 1 stopped and came back: its three preferred partitions are led by 2 and 3, and it is in sync again
    parts = [part(0, (1, 2, 3), 2), part(1, (1, 3, 2), 3), part(2, (1, 2, 3), 2), part(3, (2, 1, 3), 2)]
    plan = plan_rebalance(parts, ALL, (), 10)
    assert plan.elect == (("t", 0), ("t", 1), ("t", 2))
    assert plan.brokers[1].percentage == 100.0 and plan.brokers[2].elsewhere == ()


def test_share_exactly_at_the_percentage_stays_and_just_above_moves():
    at = plan_rebalance(group(10, 1), ALL, (), 10)                   # 1 of 10 = 10%: not above 10%
    assert at.elect == () and at.brokers[1].percentage == 10.0
    above = plan_rebalance(group(10, 2), ALL, (), 10)                # 2 of 10 = 20% > 10%: both move
    assert above.elect == (("t", 0), ("t", 1))
    assert plan_rebalance(group(10, 1), ALL, (), 9).elect == (("t", 0),)
    # 0% moves any single one; 100% never moves (the share cannot exceed it)
    assert plan_rebalance(group(1000, 1), ALL, (), 0).elect == (("t", 0),)
    assert plan_rebalance(group(3, 3), ALL, (), 100).elect == ()
    # 3 of 30 is exactly 10%
    assert plan_rebalance(group(30, 3), ALL, (), 10).elect == ()
    assert len(plan_rebalance(group(30, 4), ALL, (), 10).elect) == 4


def test_each_broker_is_judged_on_its_own_share():
    parts = group(10, 1) + [part(10 + p, (2, 1, 3), 1) for p in range(2)]   # broker 1: 10%, broker 2: 2 of 2
    plan = plan_rebalance(parts, ALL, (), 10)
    assert plan.elect == (("t", 10), ("t", 11))


def test_dead_preferred_replica_counts_but_is_not_elected_nor_waited_for():
    plan = plan_rebalance(group(3, 3), {2, 3}, (), 10)              # dead before it left the ISR
    assert plan.brokers[1].percentage == 100.0
    assert plan.elect == () and plan.waiting == ()
    plan = plan_rebalance(group(3, 3, isr=(2, 3)), {2, 3}, (), 10)  # dead and out of the ISR: nothing to wait for
    assert plan.elect == () and plan.waiting == ()


def test_preferred_replica_out_of_the_isr_waits():
    # back, alive, but not in sync yet for partitions 0 and 1; partition 2 already has it in the ISR
    parts = [part(0, (1, 2, 3), 2, isr=(2, 3)), part(1, (1, 2, 3), 3, isr=(3, 2)), part(2, (1, 2, 3), 2)]
    plan = plan_rebalance(parts, ALL, (), 10)
    assert plan.elect == (("t", 2),)
    assert plan.waiting == (("t", 0), ("t", 1))


def test_preferred_replica_shutting_down_is_neither_elected_nor_waited_for():
    plan = plan_rebalance(group(3, 3), ALL, {1}, 10)
    assert plan.elect == () and plan.waiting == ()
    plan = plan_rebalance(group(3, 3, isr=(2, 3)), ALL, {1}, 10)    # its controlled shutdown took it out of the ISR
    assert plan.elect == () and plan.waiting == ()
    # another broker's controlled shutdown does not stop broker 1's round
    assert plan_rebalance(group(3, 3), ALL, {3}, 10).elect == (("t", 0), ("t", 1), ("t", 2))


def test_leaderless_partition_counts_as_led_elsewhere():
    parts = [part(0, (1, 2), NO_LEADER, isr=(1,)), part(1, (1, 2), 1), part(2, (1, 2), 1)]
    plan = plan_rebalance(parts, ALL, (), 30)                       # 1 of 3 > 30%
    assert plan.elect == (("t", 0),)


def test_partition_without_a_state_counts_in_the_group_only():
    # one led elsewhere, two not created yet: 1 of 3 = 33% (not 1 of 1)
    parts = [part(0, (1, 2), 2), part(1, (1, 2), None), part(2, (1, 2), None)]
    groups = imbalance(parts)
    assert (groups[1].preferred, groups[1].elsewhere) == (3, (("t", 0),))
    assert plan_rebalance(parts, ALL, (), 40).elect == ()
    assert plan_rebalance(parts, ALL, (), 30).elect == (("t", 0),)


def test_partition_being_reassigned_counts_under_the_first_target_replica():
    # moving from (2, 3) to (1, 3): replicas = target + removing; the target's first replica is in sync already
    moving = part(0, (1, 3, 2), 2, isr=(2, 3, 1), adding=(1,), removing=(2,))
    plan = plan_rebalance([moving], ALL, (), 10)
    assert set(plan.brokers) == {1} and plan.elect == (("t", 0),)
    # not yet in sync: it waits like any returning replica
    catching_up = part(0, (1, 3, 2), 2, isr=(2, 3), adding=(1,), removing=(2,))
    assert plan_rebalance([catching_up], ALL, (), 10).waiting == (("t", 0),)


def test_empty_assignment_is_ignored():
    assert imbalance([part(0, (), None)]) == {}
