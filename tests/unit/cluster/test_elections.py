"""The controller's leader and ISR decisions, as pure functions of assignment, state and live brokers."""

from __future__ import annotations

from oncelog.cluster.elections import (
    cancel_reassignment,
    choose_leader,
    complete_reassignment,
    desired_state,
    preferred_election,
    shutdown_change,
    start_reassignment,
    unclean_election,
    with_change,
)
from oncelog.cluster.metadata_image import NO_LEADER, PartitionAssignment, PartitionState
from oncelog.errors import ErrorCode

A = PartitionAssignment((1, 2, 3))


def st(leader, isr, epoch=5, version=9):
    return PartitionState(leader, epoch, tuple(isr), 1, version)


def test_dead_leader_replaced_by_first_live_isr_member_in_assignment_order():
    new = desired_state(A, st(1, [3, 1, 2]), live={2, 3})
    assert (new.leader, new.leader_epoch, new.isr, new.version) == (2, 6, (3, 2), 9)


def test_dead_follower_leaves_isr_without_new_leader_epoch():
    new = desired_state(A, st(1, [1, 2, 3]), live={1, 3})
    assert (new.leader, new.leader_epoch, new.isr) == (1, 5, (1, 3))
    assert desired_state(A, st(1, [1, 3]), live={1, 3}) is None


def test_no_live_isr_member_goes_offline_keeping_last_isr():
    new = desired_state(A, st(1, [1]), live={2, 3})
    assert (new.leader, new.leader_epoch, new.isr) == (NO_LEADER, 6, (1,))
    # already offline and still nobody: nothing to write
    assert desired_state(A, new, live={2, 3}) is None


def test_whole_isr_dead_at_once_is_kept_whole():
    new = desired_state(A, st(1, [1, 2]), live={3})
    assert (new.leader, new.isr) == (NO_LEADER, (1, 2))
    # whichever of them returns first leads, and the ISR is cut to the live ones
    back = desired_state(A, new, live={2, 3})
    assert (back.leader, back.leader_epoch, back.isr) == (2, 7, (2,))


def test_returning_broker_outside_isr_does_not_lead_unless_unclean():
    offline = st(NO_LEADER, [1])
    assert desired_state(A, offline, live={2, 3}) is None
    new = desired_state(A, offline, live={2, 3}, unclean=True)
    assert (new.leader, new.isr, new.leader_epoch) == (2, (2,), 6)


def test_excluded_brokers_never_lead():
    assert choose_leader(A, st(1, [1, 2, 3]), live={2, 3}, excluded={2}) == (3, (2, 3))
    assert choose_leader(A, st(1, [1, 2]), live={2, 3}, excluded={2}) == (NO_LEADER, (2,))


def test_preferred_election():
    assert preferred_election(A, st(1, [1, 2, 3]), {1, 2, 3}) == (None, ErrorCode.ELECTION_NOT_NEEDED)
    new, code = preferred_election(A, st(2, [2, 3, 1]), {1, 2, 3})
    assert code == ErrorCode.NONE and (new.leader, new.leader_epoch, new.isr) == (1, 6, (2, 3, 1))
    for state, live, excluded in [(st(2, [2, 3]), {1, 2, 3}, ()), (st(2, [2, 3, 1]), {2, 3}, ()),
                                  (st(2, [1, 2, 3]), {1, 2, 3}, {1})]:
        assert preferred_election(A, state, live, excluded) == (None, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)


def test_unclean_election():
    assert unclean_election(A, st(1, [1]), {1, 2}) == (None, ErrorCode.ELECTION_NOT_NEEDED)
    new, code = unclean_election(A, st(NO_LEADER, [1]), {3})
    assert code == ErrorCode.NONE and (new.leader, new.isr) == (3, (3,))
    assert unclean_election(A, st(NO_LEADER, [1]), set()) == (None, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)


def test_controlled_shutdown_moves_leadership_and_shrinks_isr():
    new = shutdown_change(A, st(1, [1, 2, 3]), 1, {1, 2, 3})
    assert (new.leader, new.leader_epoch, new.isr) == (2, 6, (2, 3))
    new = shutdown_change(A, st(2, [2, 1, 3]), 1, {1, 2, 3})
    assert (new.leader, new.leader_epoch, new.isr) == (2, 5, (2, 3))
    assert shutdown_change(A, st(1, [1]), 1, {1, 2, 3}) is None            # keeps leading: nobody in sync
    assert shutdown_change(A, st(2, [2]), 1, {1, 2, 3}) is None            # not in the ISR
    # a second broker shutting down is not a candidate
    new = shutdown_change(A, st(1, [1, 2, 3]), 1, {1, 2, 3}, excluded={2})
    assert new.leader == 3


def test_reassignment_shape_and_completion():
    moving = start_reassignment(A, [4, 2, 5])
    assert moving.replicas == (4, 2, 5, 1, 3) and moving.adding == (4, 5) and moving.removing == (1, 3)
    # as in Kafka, the original replicas come back in their order within `replicas` (KIP-455 keeps no other copy)
    assert moving.target == (4, 2, 5) and moving.original == (2, 1, 3)
    # a new target replaces the old one against the same original replicas
    again = start_reassignment(moving, [2, 6])
    assert again.replicas == (2, 6, 1, 3) and again.adding == (6,) and again.removing == (1, 3)
    assert again.original == (2, 1, 3)
    assert complete_reassignment(moving, st(1, [1, 2, 3, 4]), {1, 2, 3, 4, 5}) is None    # 5 not yet in sync
    done, new = complete_reassignment(moving, st(1, [1, 2, 3, 4, 5]), {1, 2, 3, 4, 5})
    assert done == PartitionAssignment((4, 2, 5))
    assert (new.leader, new.leader_epoch, new.isr) == (4, 6, (2, 4, 5))
    # the leader stays when it stays a replica; only the ISR changes
    done, new = complete_reassignment(start_reassignment(A, [1, 2]), st(1, [1, 2, 3]), {1, 2, 3})
    assert done.replicas == (1, 2) and (new.leader, new.leader_epoch, new.isr) == (1, 5, (1, 2))
    # pure addition with everyone in sync: the state does not change
    done, new = complete_reassignment(start_reassignment(A, [1, 2, 3, 4]), st(1, [1, 2, 3, 4]), {1, 2, 3, 4})
    assert done.replicas == (1, 2, 3, 4) and new is None


def test_cancel_reassignment_takes_added_replicas_out():
    moving = start_reassignment(A, [4, 2, 3])
    original = PartitionAssignment((2, 3, 1))
    back, new = cancel_reassignment(moving, st(4, [4, 2, 3, 1]), {1, 2, 3, 4})
    assert back == original and (new.leader, new.leader_epoch, new.isr) == (2, 6, (2, 3, 1))
    back, new = cancel_reassignment(moving, st(1, [1, 2, 3]), {1, 2, 3, 4})
    assert back == original and new is None


def test_with_change_bumps_leader_epoch_only_for_a_new_leader():
    s = st(1, [1, 2])
    assert with_change(s, isr=[1]).leader_epoch == 5
    assert with_change(s, leader=2).leader_epoch == 6
    assert with_change(s, leader=1).leader_epoch == 5
