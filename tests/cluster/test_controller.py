"""The controller against a real ZooKeeper, with several brokers' metadata rooms in one process: election and
failover, broker death and return, offline partitions, controlled shutdown, preferred and unclean elections,
reassignment, admin errors, and every image converging by watch."""

from __future__ import annotations

import asyncio

import pytest

from oncelog.cluster.controller import ElectionType, NewTopic, TopicResult
from oncelog.cluster.metadata_image import NO_LEADER, PartitionState
from oncelog.cluster.metadata_store import NotController, StaleVersion
from oncelog.errors import ErrorCode
from tests.cluster.metadata_nodes import Node, active, converged, run, start_nodes, stop_all, until


def _state(nodes, topic, p) -> PartitionState:
    return active(nodes).image.partition(topic, p)


async def _create(nodes, *topics: NewTopic) -> None:
    results = await active(nodes).controller.create_topics(list(topics))
    assert all(r.code == ErrorCode.NONE for r in results.values()), results
    names = {t.name for t in topics}
    await until(converged(nodes, lambda im: names <= set(im.topics)
                          and all(im.partition(t, p) is not None for t in names for p in im.topics[t].assignment)),
                "every image holds the new topics")


async def _add_to_isr(node: Node, topic: str, p: int, replica: int) -> None:
    """What a leader does when a follower caught up: CAS the ISR (no controller epoch), retrying a lost race."""
    for _ in range(10):
        s = node.image.partition(topic, p)
        if replica in s.isr:
            return
        try:
            await node.store.write_partition_state(topic, p, PartitionState(s.leader, s.leader_epoch,
                                                                            s.isr + (replica,), s.controller_epoch,
                                                                            0), s.version, None)
            return
        except StaleVersion:
            await node.store.read_partition_state(topic, p)
    raise AssertionError("ISR write kept losing")


def test_one_controller_and_failover_to_a_higher_epoch(coordination_connect):
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            first = active(nodes)
            epoch = first.controller.epoch
            await until(converged(nodes, lambda im: (im.controller_id, im.controller_epoch)
                                  == (first.node_id, epoch)), "every image names the controller")
            await _create(nodes, NewTopic("t", 3, 3))
            await first.stop()
            rest = {i: n for i, n in nodes.items() if n is not first}
            await until(lambda: sum(n.active for n in rest.values()) == 1, "a new controller")
            second = active(rest)
            assert second.controller.epoch == epoch + 1
            await until(converged(rest, lambda im: im.controller_id == second.node_id
                                  and im.controller_epoch == epoch + 1), "every image names the new one")
            # the old controller's broker is gone: its leaderships moved, at a new leader epoch
            await until(converged(rest, lambda im: all(s.leader != first.node_id and first.node_id not in s.isr
                                                       for s in im.states.values())), "leaders moved")
            for p in range(3):
                s = second.image.partition("t", p)
                assert s.controller_epoch == epoch + 1 or s.leader_epoch == 0
            result = await second.controller.create_topics([NewTopic("u", 1, 2)])
            assert result["u"].code == ErrorCode.NONE
            # a broker that is not the controller answers NOT_CONTROLLER
            other = next(n for n in rest.values() if n is not second)
            refused = await other.controller.create_topics([NewTopic("v", 1, 1)])
            assert refused["v"].code == ErrorCode.NOT_CONTROLLER
        finally:
            await stop_all(nodes)

    run(body())


def test_deposed_controller_steps_down_and_answers_not_controller(coordination, coordination_connect,
                                                                  kazoo_client):
    chroot = coordination_connect[len(coordination.servers):]

    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2])
        try:
            zombie = active(nodes)
            other = next(n for n in nodes.values() if n is not zombie)
            await _create(nodes, NewTopic("t", 1, 2))
            # the seat disappears behind the zombie's back (its session expired while it was paused)
            kazoo_client(coordination.servers).delete(f"{chroot}/controller")
            old_epoch = zombie.controller.epoch
            await until(lambda: other.active, "the other broker takes the seat")
            assert other.controller.epoch == old_epoch + 1
            await until(lambda: not zombie.active, "the zombie sees the newer epoch and steps down")
            answer = await zombie.controller.create_topics([NewTopic("z", 1, 1)])
            assert answer["z"].code == ErrorCode.NOT_CONTROLLER
            # a write it still makes with its old epoch is refused as a unit
            s = zombie.image.partition("t", 0)
            with pytest.raises(NotController):
                await zombie.store.write_partition_state("t", 0, PartitionState(s.leader, s.leader_epoch + 1,
                                                                                s.isr, 0, 0), s.version, old_epoch)
            assert zombie.image.partition("t", 0) == other.image.partition("t", 0) == s
        finally:
            await stop_all(nodes)

    run(body())


def test_broker_death_elects_from_isr_at_next_epoch(coordination_connect):
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            ctl = active(nodes)
            victim = next(n for n in nodes.values() if n is not ctl)
            await _create(nodes, NewTopic("t", assignments={0: [victim.node_id, ctl.node_id],
                                                            1: [ctl.node_id, victim.node_id]}))
            before = {p: _state(nodes, "t", p) for p in (0, 1)}
            assert before[0].leader == victim.node_id and before[0].isr == (victim.node_id, ctl.node_id)
            await victim.stop()
            rest = {i: n for i, n in nodes.items() if n is not victim}
            await until(converged(rest, lambda im: im.partition("t", 0).leader == ctl.node_id
                                  and im.partition("t", 1).isr == (ctl.node_id,)), "new leader and ISR everywhere")
            led = _state(rest, "t", 0)
            assert (led.leader_epoch, led.isr) == (before[0].leader_epoch + 1, (ctl.node_id,))
            followed = _state(rest, "t", 1)
            assert (followed.leader, followed.leader_epoch) == (ctl.node_id, before[1].leader_epoch), \
                "an ISR shrink keeps the leader epoch"
            assert led.controller_epoch == ctl.controller.epoch
        finally:
            await stop_all(nodes)

    run(body())


def test_a_broker_death_moves_a_thousand_leaderships_in_a_few_zookeeper_transactions(coordination_connect):
    """The controller settles the partitions of a dead broker in multi-ops of SETTLE_BATCH states (one ZooKeeper
    transaction, one fsync on the ensemble, each), not one write per partition: every moved state znode was
    last written by one of ceil(1200 / 500) = 3 transactions."""
    from oncelog.cluster.controller import SETTLE_BATCH
    from oncelog.cluster.metadata_store import MetadataStore

    count = 1200
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            ctl = active(nodes)
            victim = next(n for n in nodes.values() if n is not ctl)
            await _create(nodes, NewTopic("many", assignments={p: [victim.node_id, ctl.node_id]
                                                               for p in range(count)}))
            epochs = {p: _state(nodes, "many", p).leader_epoch for p in range(count)}
            await victim.stop()
            rest = {i: n for i, n in nodes.items() if n is not victim}
            await until(converged(rest, lambda im: all(im.partition("many", p).leader == ctl.node_id
                                                       for p in range(count))), "every leadership moved")
            assert all(_state(rest, "many", p).leader_epoch == epochs[p] + 1 for p in range(count))
            writes = {(await ctl.store.stat(MetadataStore.state_path("many", p))).mzxid for p in range(count)}
            assert len(writes) == -(-count // SETTLE_BATCH), sorted(writes)
        finally:
            await stop_all(nodes)

    run(body())


def test_offline_partition_and_its_recovery(coordination_connect):
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            ctl = active(nodes)
            a, b = [n.node_id for n in nodes.values() if n is not ctl]
            await _create(nodes, NewTopic("t", assignments={0: [a, b]}),
                          NewTopic("u", assignments={0: [a, b]}, configs={"unclean.leader.election.enable": "true"}))

            await nodes[b].stop()                                   # the follower dies: the ISR shrinks
            await until(lambda: ctl.image.partition("t", 0).isr == (a,), "ISR without the dead follower")
            epoch = ctl.image.partition("t", 0).leader_epoch
            await nodes[a].stop()                                   # the last ISR member dies: offline
            await until(lambda: ctl.image.partition("t", 0).leader == NO_LEADER, "offline")
            off = ctl.image.partition("t", 0)
            assert off.isr == (a,) and off.leader_epoch == epoch + 1, "leader -1, the last ISR kept"

            nodes[b] = await Node(coordination_connect, b).start()  # not in the ISR: no clean leader for it
            await until(lambda: ctl.image.partition("u", 0).leader == b, "unclean election where the topic allows")
            assert ctl.image.partition("u", 0).isr == (b,)
            assert ctl.image.partition("t", 0).leader == NO_LEADER

            nodes[a] = await Node(coordination_connect, a).start()  # the last ISR member returns
            await until(converged(nodes, lambda im: im.partition("t", 0).leader == a), "back online everywhere")
            back = ctl.image.partition("t", 0)
            assert back.leader_epoch == epoch + 2 and back.isr == (a,)
        finally:
            await stop_all(nodes)

    run(body())


def test_controlled_shutdown_moves_leaderships_away(coordination_connect):
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            ctl = active(nodes)
            leaving = next(n for n in nodes.values() if n is not ctl)
            other = next(n for n in nodes.values() if n is not ctl and n is not leaving)
            x, y = leaving.node_id, other.node_id
            await _create(nodes, NewTopic("t", assignments={0: [x, y], 1: [y, x]}), NewTopic("one", assignments={0: [x]}))
            stale = await ctl.controller.controlled_shutdown(x, leaving.epoch - 1)
            assert stale.code == ErrorCode.STALE_BROKER_EPOCH
            assert (await ctl.controller.controlled_shutdown(99, 1)).code == ErrorCode.BROKER_NOT_AVAILABLE
            result = await ctl.controller.controlled_shutdown(x, leaving.epoch)
            assert result.code == ErrorCode.NONE and result.remaining == [("one", 0)]
            s0, s1 = ctl.image.partition("t", 0), ctl.image.partition("t", 1)
            assert (s0.leader, s0.isr, s0.leader_epoch) == (y, (y,), 1)
            assert (s1.leader, s1.isr, s1.leader_epoch) == (y, (y,), 0)
            # while it shuts down it is not chosen to lead, not even by a preferred election
            await _add_to_isr(other, "t", 0, x)
            elected = await ctl.controller.elect_leaders([("t", 0)])
            assert elected[("t", 0)].code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
            await until(converged(nodes, lambda im: im.partition("t", 0).leader == y), "every image agrees")
        finally:
            await stop_all(nodes)

    run(body())


def test_preferred_election_and_auto_rebalance(coordination_connect):
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3], "leader.imbalance.check.interval.seconds=1")
        try:
            ctl = active(nodes)
            x = next(n for n in nodes.values() if n is not ctl).node_id
            await _create(nodes, NewTopic("t", assignments={0: [x, ctl.node_id], 1: [x, ctl.node_id]}),
                          NewTopic("u", assignments={0: [ctl.node_id, x]}))
            ctl.controller.config.values["auto.leader.rebalance.enable"] = False
            await nodes[x].stop()
            await until(lambda: all(ctl.image.partition("t", p).leader == ctl.node_id for p in (0, 1)), "moved")
            nodes[x] = await Node(coordination_connect, x, "leader.imbalance.check.interval.seconds=1").start()
            await until(lambda: ctl.image.broker_epoch(x) == nodes[x].epoch, "the controller sees x back")
            elected = await ctl.controller.elect_leaders([("t", 0), ("u", 0), ("nope", 0)])
            assert elected[("t", 0)].code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, "not back in the ISR yet"
            assert elected[("u", 0)].code == ErrorCode.ELECTION_NOT_NEEDED
            assert elected[("nope", 0)].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            await _add_to_isr(ctl, "t", 0, x)                # the leader saw it catch up
            await _add_to_isr(ctl, "t", 1, x)
            elected = await ctl.controller.elect_leaders([("t", 0)])
            assert elected[("t", 0)].code == ErrorCode.NONE
            s = ctl.image.partition("t", 0)
            assert s.leader == x and s.leader_epoch == 2
            unclean = await ctl.controller.elect_leaders([("t", 0)], ElectionType.UNCLEAN)
            assert unclean[("t", 0)].code == ErrorCode.ELECTION_NOT_NEEDED
            # t-1 is led by a non-preferred replica: 50% of x's preferred leaderships > 10%, so the periodic
            # rebalance moves it back by itself
            ctl.controller.config.values["auto.leader.rebalance.enable"] = True
            await until(converged(nodes, lambda im: im.partition("t", 1).leader == x), "auto rebalance")
        finally:
            await stop_all(nodes)

    run(body())


def test_reassignment_completes_when_new_replicas_are_in_sync(coordination_connect):
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            ctl = active(nodes)
            a, b = [n.node_id for n in nodes.values() if n is not ctl]
            c = ctl.node_id
            await _create(nodes, NewTopic("t", assignments={0: [a, b], 1: [a, b]}))
            result = await ctl.controller.alter_reassignments({("t", 0): [c, b], ("t", 1): [a, 7], ("x", 0): [a],
                                                               ("t", 9): None})
            assert result[("t", 0)].code == ErrorCode.NONE
            assert result[("t", 1)].code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
            assert result[("x", 0)].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert result[("t", 9)].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            moving = ctl.image.assignment("t", 0)
            assert (moving.replicas, moving.adding, moving.removing) == ((c, b, a), (c,), (a,))
            await until(converged(nodes, lambda im: im.assignment("t", 0) == moving), "every image sees the move")
            leader = nodes[a]
            await _add_to_isr(leader, "t", 0, c)             # the new replica caught up
            await until(converged(nodes, lambda im: im.assignment("t", 0).replicas == (c, b)
                                  and not im.assignment("t", 0).reassigning), "reassignment completed")
            s = ctl.image.partition("t", 0)
            assert s.leader == c and s.leader_epoch == 1 and set(s.isr) == {b, c}, "the removed leader moved off"
            none = await ctl.controller.alter_reassignments({("t", 0): None})
            assert none[("t", 0)].code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
            # a move started then cancelled goes back to the original replicas
            await ctl.controller.alter_reassignments({("t", 1): [c, b]})
            await ctl.controller.alter_reassignments({("t", 1): None})
            back = ctl.image.assignment("t", 1)
            assert set(back.replicas) == {a, b} and not back.reassigning
        finally:
            await stop_all(nodes)

    run(body())


def test_topic_admin_errors_and_partitions(coordination_connect):
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3], "default.replication.factor=3",
                                  "num.partitions=2")
        try:
            ctl = active(nodes).controller
            r = await ctl.create_topics([NewTopic("t"), NewTopic("big", 1, 4), NewTopic("a.b", 1, 1),
                                         NewTopic("dup", 1, 1), NewTopic("dup", 2, 1)])
            assert (r["t"].code, r["t"].num_partitions, r["t"].replication_factor) == (ErrorCode.NONE, 2, 3)
            assert r["big"].code == ErrorCode.INVALID_REPLICATION_FACTOR
            assert "only 3 broker(s) are registered" in r["big"].message
            assert r["dup"].code == ErrorCode.INVALID_REQUEST
            again = await ctl.create_topics([NewTopic("t", 1, 1), NewTopic("a_b", 1, 1)])
            assert again["t"].code == ErrorCode.TOPIC_ALREADY_EXISTS
            assert again["a_b"].code == ErrorCode.INVALID_TOPIC_EXCEPTION
            only = await ctl.create_topics([NewTopic("v", 1, 1)], validate_only=True)
            assert only["v"].code == ErrorCode.NONE and "v" not in active(nodes).image.topics

            grown = await ctl.create_partitions({"t": (4, None), "a.b": (1, None), "nope": (3, None)})
            assert grown["t"].code == ErrorCode.NONE
            assert grown["a.b"].code == ErrorCode.INVALID_PARTITIONS
            assert grown["nope"].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            await until(converged(nodes, lambda im: im.topics["t"].partition_count == 4
                                  and all(im.partition("t", p) is not None for p in range(4))), "4 partitions")
            leaders = {active(nodes).image.partition("t", p).leader for p in range(4)}
            assert len(leaders) >= 2, "leaders spread over brokers"

            cfg = await ctl.set_topic_configs("t", {"retention.ms": "1000"})
            assert cfg.code == ErrorCode.NONE
            bad = await ctl.set_topic_configs("t", {"retention.ms": "soon"})
            assert bad.code == ErrorCode.INVALID_CONFIG
            await until(converged(nodes, lambda im: im.topic_configs.get("t") == {"retention.ms": "1000"}),
                        "configs everywhere")

            deleted = await ctl.delete_topics(["t", "nope"])
            assert deleted["t"].code == ErrorCode.NONE
            assert deleted["nope"].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            await until(converged(nodes, lambda im: "t" not in im.topics and "t" in im.deleting), "deleted")
        finally:
            await stop_all(nodes)

    run(body())


def test_restarted_broker_loses_its_leaderships_and_isr_membership(coordination_connect):
    """A broker that restarts faster than anyone noticed (a new epoch under the same id) is treated as dead
    and returned: its old incarnation's leaderships move, it leaves the ISRs, and it rejoins by catching up."""
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            ctl = active(nodes)
            x, y = [n.node_id for n in nodes.values() if n is not ctl]
            await _create(nodes, NewTopic("t", assignments={0: [x, y]}))
            old_epoch = nodes[x].epoch
            ctl.image.unsubscribe(ctl.controller._on_delta)      # the controller misses the death...
            await nodes[x].stop()
            nodes[x] = await Node(coordination_connect, x).start()
            await until(lambda: ctl.image.broker_epoch(x) == nodes[x].epoch, "the restart registered")
            assert nodes[x].epoch > old_epoch
            ctl.image.subscribe(ctl.controller._on_delta)        # ...and sees only the new epoch
            ctl.controller._reconcile_all = True
            ctl.controller._queue_reconcile()
            await until(lambda: ctl.image.partition("t", 0).leader == y, "leadership moved off the old incarnation")
            assert ctl.image.partition("t", 0).isr == (y,)
        finally:
            await stop_all(nodes)

    run(body())


def test_leader_isr_write_and_controller_decision_lose_no_update(coordination_connect):
    """The leader shrinks the ISR while the controller reacts to a death, and the controller decides from an image
    that has not seen the leader's write yet: its CAS fails, it re-reads, and both changes survive (§7: no lost
    ISR update)."""
    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3, 4])
        try:
            ctl = active(nodes)
            x, y, z = [n.node_id for n in nodes.values() if n is not ctl]
            await _create(nodes, NewTopic("t", assignments={0: [x, y, z]}))
            before = ctl.image.partition("t", 0)
            stale = before                                   # what the controller's image holds now
            s = nodes[x].image.partition("t", 0)
            await nodes[x].store.write_partition_state(      # the leader drops lagging z
                "t", 0, PartitionState(x, s.leader_epoch, (x, y), s.controller_epoch, 0), s.version, None)
            await until(lambda: ctl.image.partition("t", 0).isr == (x, y), "the controller's image catches up")
            ctl.image.states[("t", 0)] = stale               # ...and is set back, as if the watch had not fired
            await nodes[y].stop()                            # the controller must now drop dead y
            await until(converged(nodes, lambda im: im.partition("t", 0).isr == (x,)), "both changes kept")
            after = ctl.image.partition("t", 0)
            assert (after.leader, after.leader_epoch) == (x, before.leader_epoch)
            assert after.version == before.version + 2, "two writes, none blind"
        finally:
            await stop_all(nodes)

    run(body())


def test_partitioned_controller_expires_and_comes_back_as_a_member(coordination, coordination_connect,
                                                                   kazoo_client):
    """The seat rides a session of its own (oncelog.controller.session.timeout.ms): cut off, the controller loses
    it after that timeout, while its broker session (long here) still lives, and another broker takes over; then
    the broker session expires too, its roles move, and it comes back as a member that does not act."""
    from tests.cluster.tcp_proxy import TcpProxy

    chroot = coordination_connect[len(coordination.servers):]
    broker_session_ms = 20000

    async def body():
        proxy = await TcpProxy("127.0.0.1", coordination.port).start()
        first = await Node(proxy.address + chroot, 1,                     # the controller-to-be, behind the proxy
                           session_timeout_ms=broker_session_ms).start()
        await until(lambda: first.active, "broker 1 controls")
        others = {i: await Node(coordination_connect, i).start() for i in (2, 3)}
        nodes = {1: first, **others}
        try:
            epoch = first.controller.epoch
            await until(converged(nodes, lambda im: set(im.brokers) == {1, 2, 3}), "all registered")
            await _create(nodes, NewTopic("t", assignments={0: [1, 2], 1: [2, 1]}))
            old_broker_epoch = first.epoch
            session = first.store.client_id()
            loop = asyncio.get_running_loop()
            proxy.cut()
            cut_at = loop.time()
            await until(lambda: not first.active, "a SUSPENDED controller stops acting")
            # The seat frees when the seat session expires, long before broker 1's session would.
            await until(lambda: sum(n.active for n in others.values()) == 1, "another controller",
                        timeout=broker_session_ms / 1000 - 2)
            taken_after = loop.time() - cut_at
            second = active(others)
            assert second.controller.epoch == epoch + 1
            assert second.image.broker_epoch(1) == old_broker_epoch, "only the seat went, not the registration"
            assert taken_after < broker_session_ms / 1000
            kazoo_client(coordination.servers, client_id=session).stop()   # now its broker session expires
            await until(converged(others, lambda im: im.partition("t", 0).leader == 2
                                  and im.partition("t", 1).isr == (2,)), "broker 1's roles moved")
            proxy.mend()
            await until(lambda: first.store.state == "CONNECTED" and first.store.broker_epoch is not None
                        and first.store.broker_epoch > old_broker_epoch, "broker 1 registered again")
            await until(converged(nodes, lambda im: im.broker_epoch(1) == first.store.broker_epoch
                                  and im.controller_id == second.node_id), "every image agrees")
            assert not first.active and first.controller.epoch is None and first.store.controller_epoch is None
            assert first.image.partition("t", 0) == second.image.partition("t", 0)
            s = first.image.partition("t", 0)
            with pytest.raises(NotController):                   # its old epoch writes nothing
                await first.store.write_partition_state("t", 0, PartitionState(1, s.leader_epoch + 1, (1,), 0, 0),
                                                        s.version, epoch)
            answer = await first.controller.create_topics([NewTopic("z", 1, 1)])
            assert answer["z"].code == ErrorCode.NOT_CONTROLLER
        finally:
            await stop_all(nodes)
            await proxy.close()

    run(body())


def test_oversized_operations_are_refused_and_big_topics_deleted_in_steps(coordination_connect, monkeypatch):
    """ZooKeeper drops the connection of a request over jute.maxbuffer; the store measures every multi-op first.
    A creation that does not fit goes in steps behind a `creating` mark; one whose topic znode alone does not fit,
    and a CreatePartitions that does not, are refused as Kafka refuses an oversized operation; a topic grown past
    what one deletion fits is deleted in steps. (The limit is lowered here so that small topics reach it.)"""
    from oncelog.cluster import metadata_store

    monkeypatch.setattr(metadata_store, "MAX_MULTI_BYTES", 20_000)

    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            ctl = active(nodes).controller
            # Too big for one request: created in steps, and every image shows it whole or not at all.
            seen: list[int] = []
            for node in nodes.values():
                node.image.subscribe(lambda delta, im=node.image: seen.extend(
                    len([k for k in im.states if k[0] == "huge"]) for t in delta.topics_added if t == "huge"))
            created = await ctl.create_topics([NewTopic("huge", 400, 2)])
            assert created["huge"].code == ErrorCode.NONE, created
            await until(converged(nodes, lambda im: len([k for k in im.states if k[0] == "huge"]) == 400), "huge")
            assert seen == [400, 400, 400]
            assert active(nodes).store.pending_creations == set()
            # A topic whose own znode (its assignment) exceeds one request is refused as Kafka refuses an
            # oversized operation.
            too_big = await ctl.create_topics([NewTopic("huger", 3000, 2)])
            assert too_big["huger"] == TopicResult(ErrorCode.POLICY_VIOLATION,
                                                   "Unable to perform excessively large batch operation.")
            assert "huger" not in await active(nodes).store.children("/topics")
            await _create(nodes, NewTopic("t", 40, 2))
            for count in (80, 120, 160, 200, 240):
                grown = await ctl.create_partitions({"t": (count, None)})
                assert grown["t"].code == ErrorCode.NONE, grown
            assert (await ctl.create_partitions({"t": (640, None)}))["t"].code == ErrorCode.POLICY_VIOLATION
            await until(converged(nodes, lambda im: len([k for k in im.states if k[0] == "t"]) == 240), "240")
            deleted = await ctl.delete_topics(["t"])
            assert deleted["t"].code == ErrorCode.NONE
            await until(converged(nodes, lambda im: "t" not in im.topics and "t" in im.deleting
                                  and not any(k[0] == "t" for k in im.states)),
                        "the big topic gone everywhere")
            assert await active(nodes).store.children("/topics") == ["huge"]
        finally:
            await stop_all(nodes)

    run(body())


def test_a_creation_in_steps_its_controller_did_not_finish_is_removed_by_the_next(coordination_connect,
                                                                                   monkeypatch):
    """The controller loses ZooKeeper between the steps of a big creation (and cannot clean up): no image ever
    shows the half-made topic, the next controller removes it, and the same CreateTopics then succeeds."""
    import asyncio

    from oncelog.cluster import metadata_store
    from oncelog.cluster.metadata_store import StoreUnavailable

    monkeypatch.setattr(metadata_store, "MAX_MULTI_BYTES", 20_000)

    async def body():
        nodes = await start_nodes(coordination_connect, [1, 2, 3])
        try:
            first = active(nodes)
            store = first.store
            real = store._commit
            steps = 0
            reached, release = asyncio.Event(), asyncio.Event()

            async def fails_after_two_steps(build, controller_epoch):
                nonlocal steps
                steps += 1
                if steps >= 3:                 # the topic znode and one batch of partitions are written
                    reached.set()
                    await release.wait()
                    raise StoreUnavailable("ZooKeeper session is SUSPENDED (test)")
                return await real(build, controller_epoch)

            store._commit = fails_after_two_steps
            creation = asyncio.ensure_future(first.controller.create_topics([NewTopic("half", 400, 2)]))
            await asyncio.wait_for(reached.wait(), 30)
            rest = {i: n for i, n in nodes.items() if n is not first}
            assert "half" in await next(iter(rest.values())).store.children("/topics")
            assert all("half" not in n.image.topics and not any(k[0] == "half" for k in n.image.states)
                       for n in nodes.values())
            release.set()
            await asyncio.gather(creation, return_exceptions=True)
            assert steps > 3                   # its own clean-up was tried, and failed
            assert "half" in await next(iter(rest.values())).store.children("/topics")
            await first.stop()
            await until(lambda: any(n.active for n in rest.values()), "a new controller")
            ctl = active(rest)
            await until(lambda: "half" not in ctl.store.pending_creations, "the half-made topic removed")
            assert "half" not in await ctl.store.children("/topics")
            await _create(rest, NewTopic("half", 400, 2))
            assert all(len([k for k in n.image.states if k[0] == "half"]) == 400 for n in rest.values())
        finally:
            await stop_all(nodes)

    run(body())
