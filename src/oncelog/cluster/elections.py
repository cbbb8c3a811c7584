"""Leader and ISR decisions of the controller, as pure functions of (assignment, state, live brokers).

Every function answers what a partition's state should become, or None when it should stay as it is; the
controller writes the answer with a compare-and-set and, when it loses, asks again with the newer state. A new
leader always comes with leader epoch + 1 (that is what fences the old one, docs/cluster.md §3); an ISR change
alone keeps the leader epoch (only the partition epoch, the znode version, moves), as in KRaft.

`excluded` are brokers in controlled shutdown: alive, but never chosen to lead.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from oncelog.errors import ErrorCode

from .metadata_image import NO_LEADER, PartitionAssignment, PartitionState


def with_change(state: PartitionState, leader: int | None = None, isr: Sequence[int] | None = None) -> PartitionState:
    """`state` with a new leader (leader epoch + 1 if it differs) and/or a new ISR."""
    new_leader = state.leader if leader is None else leader
    epoch = state.leader_epoch + 1 if new_leader != state.leader else state.leader_epoch
    return PartitionState(new_leader, epoch, tuple(state.isr if isr is None else isr), state.controller_epoch,
                          state.version, state.log_start_floor)


def choose_leader(
    assignment: PartitionAssignment,
    state: PartitionState,
    live: Iterable[int],
    excluded: Iterable[int] = (),
    unclean: bool = False,
) -> tuple[int, tuple[int, ...]]:
    """A leader for a partition whose leader is gone: the first replica in assignment order that is alive, not
    excluded and in the ISR, with the ISR cut to live brokers. With none: an unclean choice (the first live
    replica, ISR = itself) if allowed, else NO_LEADER with the ISR kept: cut to live brokers, or whole when
    none of it is alive, so that whichever of its members returns first can lead again."""
    live, excluded = set(live), set(excluded)
    live_isr = tuple(r for r in state.isr if r in live)
    for r in assignment.replicas:
        if r in live and r not in excluded and r in state.isr:
            return r, live_isr
    if unclean:
        for r in assignment.replicas:
            if r in live and r not in excluded:
                return r, (r,)
    return NO_LEADER, live_isr or state.isr


def desired_state(
    assignment: PartitionAssignment,
    state: PartitionState,
    live: Iterable[int],
    excluded: Iterable[int] = (),
    unclean: bool = False,
) -> PartitionState | None:
    """The state a partition should have with these live brokers (§5.2: a broker dies, a broker returns).
    A live leader keeps its leadership and loses dead ISR members; a dead or missing leader is replaced."""
    live = set(live)
    if state.leader != NO_LEADER and state.leader in live:
        isr = tuple(r for r in state.isr if r in live)
        return None if isr == state.isr else with_change(state, isr=isr)
    leader, isr = choose_leader(assignment, state, live, excluded, unclean)
    if leader == state.leader and isr == state.isr:
        return None
    return with_change(state, leader=leader, isr=isr)


def preferred_election(
    assignment: PartitionAssignment, state: PartitionState, live: Collection[int], excluded: Collection[int] = ()
) -> tuple[PartitionState | None, ErrorCode]:
    """ElectLeaders PREFERRED: the first replica, if alive, not excluded and in the ISR."""
    preferred = assignment.replicas[0]
    if state.leader == preferred:
        return None, ErrorCode.ELECTION_NOT_NEEDED
    if preferred not in live or preferred in excluded or preferred not in state.isr:
        return None, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    return with_change(state, leader=preferred), ErrorCode.NONE


def unclean_election(
    assignment: PartitionAssignment, state: PartitionState, live: Collection[int], excluded: Collection[int] = ()
) -> tuple[PartitionState | None, ErrorCode]:
    """ElectLeaders UNCLEAN: for a partition without a live leader, an in-sync replica if one is alive, else any
    live replica."""
    if state.leader != NO_LEADER and state.leader in live:
        return None, ErrorCode.ELECTION_NOT_NEEDED
    leader, isr = choose_leader(assignment, state, live, excluded, unclean=True)
    if leader == NO_LEADER:
        return None, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    return with_change(state, leader=leader, isr=isr), ErrorCode.NONE


def shutdown_change(
    assignment: PartitionAssignment, state: PartitionState, node_id: int, live: Collection[int],
    excluded: Collection[int] = ()
) -> PartitionState | None:
    """Controlled shutdown of `node_id`: its leadership moves to the first other live, in-sync replica not
    shutting down (it keeps leading when there is none); as a follower it leaves the ISR unless it is the last."""
    if state.leader == node_id:
        others = [r for r in assignment.replicas if r != node_id and r in live and r in state.isr
                  and r not in excluded]
        if not others:
            return None
        return with_change(state, leader=others[0], isr=[r for r in state.isr if r != node_id])
    if node_id in state.isr and len(state.isr) > 1:
        return with_change(state, isr=[r for r in state.isr if r != node_id])
    return None


def start_reassignment(assignment: PartitionAssignment, target: Sequence[int]) -> PartitionAssignment:
    """KIP-455: replicas = target followed by the replicas being removed; `adding`/`removing` against the original
    replicas (a new target during a reassignment replaces the old target, the original stays). As in Kafka, the
    original replicas are `replicas` minus `adding`, in that order: a cancelled move may reorder them."""
    original = assignment.original
    target = tuple(target)
    return PartitionAssignment(target + tuple(r for r in original if r not in target),
                               adding=tuple(r for r in target if r not in original),
                               removing=tuple(r for r in original if r not in target))


def cancel_reassignment(
    assignment: PartitionAssignment, state: PartitionState | None, live: Collection[int],
    excluded: Collection[int] = ()
) -> tuple[PartitionAssignment, PartitionState | None]:
    """Back to the original replicas: those being added leave the ISR, and the leadership if they hold it."""
    original = assignment.original
    if state is None or not (state.leader in assignment.adding or set(assignment.adding) & set(state.isr)):
        return PartitionAssignment(original), None
    isr = [r for r in state.isr if r not in assignment.adding]
    leader = state.leader
    if leader in assignment.adding:
        candidates = [r for r in original if r in isr and r in live and r not in excluded]
        leader = candidates[0] if candidates else NO_LEADER
    return PartitionAssignment(original), with_change(state, leader=leader, isr=isr or state.isr)


def complete_reassignment(
    assignment: PartitionAssignment, state: PartitionState, live: Collection[int], excluded: Collection[int] = ()
) -> tuple[PartitionAssignment, PartitionState | None] | None:
    """The end of a reassignment once every added replica is in the ISR: the removed replicas leave the
    assignment and the ISR, and the leadership moves to the first in-sync target replica if the leader is removed
    (or dead). None while not ready (an added replica not yet in sync, or no target replica able to lead).
    The state is None when it does not change."""
    if not assignment.reassigning or not set(assignment.adding) <= set(state.isr):
        return None
    target = assignment.target
    isr = [r for r in state.isr if r in target]
    leader = state.leader
    if leader not in target or leader not in live:
        candidates = [r for r in target if r in isr and r in live and r not in excluded]
        if not candidates:
            return None
        leader = candidates[0]
    new = with_change(state, leader=leader, isr=isr)
    return PartitionAssignment(target), (None if new == state else new)
