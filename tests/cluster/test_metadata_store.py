"""MetadataStore against a real ZooKeeper: registration and epochs, the controller seat and its fencing,
compare-and-set, topic znodes, watches feeding every image, the session (lease, expiry, rebuild)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from oncelog.cluster.metadata_image import MetadataImage, PartitionState
from oncelog.cluster.metadata_store import (
    BrokerIdInUse,
    MetadataStore,
    NotController,
    StaleVersion,
    StoreUnavailable,
    TopicExists,
)
from tests.cluster.metadata_nodes import START_TIMEOUT_S, run, until, wait_s
from tests.cluster.tcp_proxy import TcpProxy

SESSION_MS = 6000


async def _store(connect: str, session_ms: int = SESSION_MS) -> MetadataStore:
    store = MetadataStore(connect, session_ms, asyncio.get_running_loop(), MetadataImage())
    await store.start(START_TIMEOUT_S)
    return store


async def _close(*stores: MetadataStore) -> None:
    for store in stores:
        await store.close()


def _same_view(a: MetadataImage, b: MetadataImage) -> bool:
    return (a.brokers == b.brokers and a.topics == b.topics and a.states == b.states
            and a.topic_configs == b.topic_configs and a.deleting == b.deleting
            and (a.controller_id, a.controller_epoch) == (b.controller_id, b.controller_epoch))


def test_layout_under_default_chroot_and_cluster_id(coordination, kazoo_client):
    root = f"/oncelog-{uuid.uuid4().hex[:8]}"

    async def body():
        a = MetadataStore(coordination.servers, SESSION_MS, asyncio.get_running_loop(), MetadataImage(), chroot=root)
        await a.start(START_TIMEOUT_S, cluster_id="proposed-1")
        b = await _store(coordination.servers + root)           # the chroot in the connect string
        try:
            assert a.cluster_id == b.cluster_id == "proposed-1" == a.image.cluster_id
            assert (await b.dump("/cluster_id"))["version"] == 1
        finally:
            await _close(a, b)

    run(body())
    zk = kazoo_client(coordination.servers)
    assert set(zk.get_children(root)) >= {"brokers", "topics", "configs", "deleting", "controller_epoch",
                                          "cluster_id"}


def test_registration_epochs_and_duplicate_node_id(coordination_connect):
    async def body():
        a, b = await _store(coordination_connect), await _store(coordination_connect)
        try:
            e1 = await a.register_broker(1, "127.0.0.1", 9001, instance_id="disk-a")
            with pytest.raises(BrokerIdInUse, match=r"node.id 1 is registered by a live broker at 127.0.0.1:9001"):
                await b.register_broker(1, "127.0.0.1", 9101, instance_id="disk-b")
            e2 = await b.register_broker(2, "127.0.0.1", 9002, rack="r2")
            assert e2 > e1
            await until(lambda: set(a.image.brokers) == {1, 2} == set(b.image.brokers), "both registrations seen")
            assert a.image.brokers[2].rack == "r2" and a.image.brokers[2].epoch == e2
            await a.close()
            await until(lambda: set(b.image.brokers) == {2}, "the closed session's registration gone")
            c = await _store(coordination_connect)
            e1_again = await c.register_broker(1, "127.0.0.1", 9001, instance_id="disk-a")
            assert e1_again > e2, "a new registration is a new incarnation with a higher epoch"
            await until(lambda: b.image.broker_epoch(1) == e1_again, "the new epoch seen by watch")
            await c.close()
        finally:
            await _close(a, b)

    run(body())


def test_a_removed_registration_is_renewed_unless_the_broker_is_leaving(coordination_connect, kazoo_client):
    """What a controller's crash probe does to a broker it takes for dead (cluster/crash_probe.py): delete its
    registration. A broker whose session lives registers again under a new epoch; one that is leaving
    (`keep_registered` False, set before its listener closes) stays unregistered."""
    zk = kazoo_client(coordination_connect)

    async def body():
        a, b = await _store(coordination_connect), await _store(coordination_connect)
        try:
            first = await a.register_broker(1, "127.0.0.1", 9001, instance_id="disk-a")
            await b.register_broker(2, "127.0.0.1", 9002, instance_id="disk-b")
            await until(lambda: set(b.image.brokers) == {1, 2}, "both registrations seen")
            zk.delete("/brokers/ids/1")
            await until(lambda: (b.image.broker_epoch(1) or 0) > first, "broker 1 registered again, a new epoch")
            assert a.broker_epoch == b.image.broker_epoch(1)
            b.keep_registered = False
            zk.delete("/brokers/ids/2")
            await until(lambda: 2 not in a.image.brokers, "broker 2's registration gone")
            # Longer than a renewal takes (one ZooKeeper create, seen by watch just above for broker 1).
            await asyncio.sleep(2)
            assert zk.exists("/brokers/ids/2") is None and 2 not in a.image.brokers
        finally:
            await _close(a, b)

    run(body())


_CRASHING_BROKER = """
import asyncio, sys
from oncelog.cluster.metadata_image import MetadataImage
from oncelog.cluster.metadata_store import MetadataStore

async def main():
    store = MetadataStore(sys.argv[1], int(sys.argv[2]), asyncio.get_running_loop(), MetadataImage())
    await store.start(60)
    print(await store.register_broker(7, "127.0.0.1", 9007, instance_id="disk-7"), flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_restart_after_kill_waits_for_the_old_session(coordination_connect, caplog):
    session_ms = 3000
    proc = subprocess.Popen([sys.executable, "-c", _CRASHING_BROKER, coordination_connect, str(session_ms)],
                            stdout=subprocess.PIPE, text=True)
    try:
        old_epoch = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    killed_at = time.monotonic()

    async def body():
        store = await _store(coordination_connect, session_ms)
        try:
            # another broker claiming node 7 is refused at once, naming the registration it collides with
            with pytest.raises(BrokerIdInUse, match="127.0.0.1:9007"):
                await store.register_broker(7, "127.0.0.1", 9107, instance_id="disk-other")
            with caplog.at_level(logging.WARNING, logger="oncelog.cluster.metadata_store"):
                epoch = await store.register_broker(7, "127.0.0.1", 9007, instance_id="disk-7")
            return epoch, time.monotonic()
        finally:
            await store.close()

    epoch, registered_at = run(body())
    assert epoch > old_epoch
    assert "still registered by a previous session of this broker" in caplog.text
    assert registered_at - killed_at < session_ms / 1000 + 5, "bounded by the session timeout"


def test_unreachable_service_is_retried_then_used(coordination_factory, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def body():
        loop = asyncio.get_running_loop()
        store = MetadataStore(f"127.0.0.1:{port}", SESSION_MS, loop, MetadataImage())
        starting = loop.create_task(store.start(START_TIMEOUT_S + 30))
        await until(lambda: "unreachable" in caplog.text, "a log line saying the service is unreachable")
        assert not starting.done()
        await loop.run_in_executor(None, lambda: coordination_factory(port=port))
        async with asyncio.timeout(START_TIMEOUT_S + 30):
            await starting
        try:
            assert store.state == "CONNECTED" and store.cluster_id
        finally:
            await store.close()

        never = MetadataStore(f"127.0.0.1:{port + 1 if port < 65535 else port - 1}", SESSION_MS, loop,
                              MetadataImage())
        with pytest.raises(StoreUnavailable):
            await never.start(2.0)

    with caplog.at_level(logging.WARNING, logger="oncelog.cluster.metadata_store"):
        run(body())


def test_controller_seat_epochs_and_fencing_of_a_deposed_controller(coordination_connect, kazoo_client,
                                                                   coordination):
    async def body():
        a, b = await _store(coordination_connect), await _store(coordination_connect)
        try:
            ea = await a.register_broker(1, "127.0.0.1", 9001)
            eb = await b.register_broker(2, "127.0.0.1", 9002)
            epoch = await a.try_become_controller(1, ea)
            assert epoch is not None and a.controller_epoch == epoch
            assert await b.try_become_controller(2, eb) is None
            await until(lambda: (b.image.controller_id, b.image.controller_epoch) == (1, epoch), "b sees a")
            seat = await a.dump("/controller")
            assert (seat["version"], seat["broker_id"], seat["broker_epoch"], seat["controller_epoch"]) == (
                1, 1, ea, epoch)
            assert (await a.dump("/controller_epoch"))["controller_epoch"] == epoch
            created = await a.create_topic("t", uuid.uuid4().bytes, {0: [1, 2]}, {}, epoch)
            assert created.partition_count == 1

            # a's seat vanishes without a noticing (as when its session expired during a long pause)
            chroot = coordination_connect[len(coordination.servers):]
            kazoo_client(coordination.servers).delete(f"{chroot}/controller")
            await until(lambda: b.image.controller_id == -1, "b sees the seat free")
            epoch_b = await b.try_become_controller(2, eb)
            assert epoch_b == epoch + 1
            state = a.image.partition("t", 0)
            with pytest.raises(NotController):
                await a.write_partition_state("t", 0, PartitionState(2, 1, (2,), epoch, 0), state.version, epoch)
            with pytest.raises(NotController):
                await a.create_topic("u", uuid.uuid4().bytes, {0: [1]}, {}, epoch)
            assert a.controller_epoch is None, "a knows it is no longer controller"
            assert (await a.dump(b.state_path("t", 0)))["leader"] == 1, "nothing of the zombie's was written"
            await b.write_partition_state("t", 0, PartitionState(2, 1, (2,), 0, 0), state.version, epoch_b)
            await until(lambda: a.image.partition("t", 0).leader == 2, "a's image follows the new controller")
            assert a.image.partition("t", 0).controller_epoch == epoch_b
        finally:
            await _close(a, b)

    run(body())


def test_compare_and_set_conflicts(coordination_connect):
    async def body():
        a, b = await _store(coordination_connect), await _store(coordination_connect)
        try:
            ea = await a.register_broker(1, "127.0.0.1", 9001)
            epoch = await a.try_become_controller(1, ea)
            await a.create_topic("t", uuid.uuid4().bytes, {0: [1, 2, 3]}, {}, epoch)
            await until(lambda: b.image.partition("t", 0) is not None, "b reads the new partition")
            s = b.image.partition("t", 0)
            # a leader's ISR shrink and a controller's election race on the same version: one wins
            leader_write = b.write_partition_state("t", 0, PartitionState(1, 0, (1, 2), s.controller_epoch, 0),
                                                   s.version, None)
            controller_write = a.write_partition_state("t", 0, PartitionState(2, 1, (2, 3), 0, 0), s.version, epoch)
            results = await asyncio.gather(leader_write, controller_write, return_exceptions=True)
            assert sorted(type(r).__name__ for r in results) == ["StaleVersion", "int"]
            winner = next(r for r in results if isinstance(r, int))
            assert winner == s.version + 1
            # the loser re-reads: both images converge on the winner
            await a.read_partition_state("t", 0)
            await until(lambda: a.image.partition("t", 0) == b.image.partition("t", 0), "images agree")
            with pytest.raises(StaleVersion):
                await b.write_partition_state("t", 0, PartitionState(1, 0, (1,), 0, 0), s.version, None)
            with pytest.raises(TopicExists, match="Topic 't' already exists."):
                await a.create_topic("t", uuid.uuid4().bytes, {0: [1]}, {}, epoch)
        finally:
            await _close(a, b)

    run(body())


def test_topic_lifecycle_converges_on_every_image(coordination_connect):
    async def body():
        stores = [await _store(coordination_connect) for _ in range(3)]
        a = stores[0]
        try:
            ea = await a.register_broker(1, "127.0.0.1", 9001)
            epoch = await a.try_become_controller(1, ea)
            topic_id = uuid.uuid4().bytes
            await a.create_topic("t", topic_id, {0: [1, 2], 1: [2, 3], 2: [3, 1]}, {"retention.ms": "5"}, epoch)
            await until(lambda: all(len([k for k in s.image.states if k[0] == "t"]) == 3 for s in stores),
                        "every image holds every partition")
            for s in stores:
                assert s.image.topics["t"].topic_id == topic_id
                assert s.image.topic_configs["t"] == {"retention.ms": "5"}
                assert s.image.partition("t", 1) == PartitionState(2, 0, (2, 3), epoch, 0)
            version = await a.set_topic_configs("t", {"retention.ms": "6"}, a.config_version("t"), epoch)
            await until(lambda: all(s.image.topic_configs["t"] == {"retention.ms": "6"} for s in stores), "configs")
            assert version == 1
            info = a.image.topics["t"]
            moved = dict(info.assignment)
            await a.write_assignment("t", {**moved, 0: [1, 2, 3], 3: [3]}, info.version, epoch,
                                     new_partitions={3: PartitionState(3, 0, (3,), epoch, 0)})
            await until(lambda: all(s.image.assignment("t", 0).replicas == (1, 2, 3)
                                    and s.image.partition("t", 3) is not None for s in stores), "new partition")

            await a.delete_topic("t", epoch)
            await until(lambda: all("t" not in s.image.topics and not any(k[0] == "t" for k in s.image.states)
                                    and "t" not in s.image.topic_configs for s in stores), "deletion seen")
            await until(lambda: all(s.image.deleting.get("t") is not None for s in stores), "/deleting seen")
            assert a.image.deleting["t"].pending == {topic_id: (1, 2, 3)}

            # re-created under the same name: a new incarnation whose versions restart at 0
            new_id = uuid.uuid4().bytes
            await a.create_topic("t", new_id, {0: [1]}, {}, epoch)
            await until(lambda: all(s.image.topics.get("t") is not None and s.image.topics["t"].topic_id == new_id
                                    and s.image.partition("t", 0) is not None for s in stores), "re-creation seen")
            assert all(s.image.partition("t", 0).version == 0 for s in stores)

            for node_id, s in zip((1, 2, 3), stores, strict=True):
                await s.complete_topic_deletion("t", topic_id, node_id)
            await until(lambda: all("t" not in s.image.deleting for s in stores), "deletion completed")
            assert all(_same_view(stores[0].image, s.image) for s in stores[1:])
        finally:
            await _close(*stores)

    run(body())


def test_a_new_topic_reaches_listeners_with_its_configs_and_states(coordination_connect):
    """A watcher's image announces a topic (first creation and re-creation under the same name) in one delta that
    already holds its config overrides and every partition's state: a replica opened on the announcement must not
    run with the defaults meanwhile."""
    async def body():
        writer, watcher = await _store(coordination_connect), await _store(coordination_connect)
        seen: list[tuple[str, dict[str, str] | None, int]] = []

        def listener(delta) -> None:
            for name in delta.topics_added:
                states = sum(1 for k in watcher.image.states if k[0] == name)
                seen.append((name, watcher.image.topic_configs.get(name), states))

        watcher.image.subscribe(listener)
        try:
            epoch = await writer.try_become_controller(1, await writer.register_broker(1, "127.0.0.1", 9001))
            for round_ in range(3):
                await writer.create_topic("c", uuid.uuid4().bytes, {p: [1] for p in range(4)},
                                          {"retention.ms": str(round_)}, epoch)
                await until(lambda n=round_ + 1: len(seen) == n, f"creation {round_} announced")
                assert seen[-1] == ("c", {"retention.ms": str(round_)}, 4)
                await writer.delete_topic("c", epoch)
                await until(lambda: "c" not in watcher.image.topics, "deletion seen")
        finally:
            await _close(writer, watcher)

    run(body())


def test_the_seat_session_owns_the_seat_and_a_clamped_timeout_is_logged(coordination, coordination_connect,
                                                                         caplog):
    """The seat is the ephemeral of the seat session, not of the broker session; ZooKeeper raises a timeout below two
    ticks of its tickTime (the development service's: 500 ms) and the broker says what it got."""
    tick_ms = coordination.tick_time_ms

    async def body():
        store = MetadataStore(coordination_connect, SESSION_MS, asyncio.get_running_loop(), MetadataImage(),
                              controller_session_timeout_ms=tick_ms)       # below the floor: raised to 2 ticks
        await store.start(START_TIMEOUT_S)
        try:
            assert store.negotiated_ms == {"broker": SESSION_MS, "controller": 2 * tick_ms}
            epoch = await store.register_broker(1, "127.0.0.1", 9001)
            assert await store.try_become_controller(1, epoch) is not None
            seat = await store.stat("/controller")
            assert seat.ephemeralOwner == store.seat_session_id != store.session_id
            assert (await store.stat("/brokers/ids/1")).ephemeralOwner == store.session_id
            assert await store.seat_still_held()
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="oncelog.cluster.metadata_store"):
        run(body())
    assert f"ZooKeeper granted a {2 * tick_ms} ms controller session for the {tick_ms} ms asked" in caplog.text


def test_lease_follows_confirmed_round_trips(coordination_factory):
    session_ms = 3000
    service = coordination_factory()

    async def body():
        loop = asyncio.get_running_loop()
        store = await _store(service.servers, session_ms)
        try:
            await store.register_broker(1, "127.0.0.1", 9001)
            assert store.lease_valid()
            await loop.run_in_executor(None, service.kill)
            killed = loop.time()
            await until(lambda: not store.lease_valid(), "the lease to run out", timeout=wait_s(session_ms))
            expired_after = loop.time() - killed
            assert expired_after <= session_ms / 1000 * 2 / 3 + 1.0, "within 2/3 of the session timeout"
            assert store.state in ("SUSPENDED", "LOST")
            await loop.run_in_executor(None, service.restart)
            await until(lambda: store.state == "CONNECTED" and store.lease_valid(), "reconnected",
                        timeout=wait_s(session_ms) + 30)
            await until(lambda: 1 in store.image.brokers, "registered again if the session was lost")
        finally:
            await store.close()

    run(body())


def test_session_expiry_registers_again_and_rebuilds_the_image(coordination, coordination_connect, kazoo_client):
    chroot = coordination_connect[len(coordination.servers):]

    async def body():
        proxy = await TcpProxy("127.0.0.1", coordination.port).start()
        behind = await _store(proxy.address + chroot)          # this broker reaches ZooKeeper through the proxy
        direct = await _store(coordination_connect)
        states: list[str] = []
        behind.on_state_change(states.append)
        try:
            old_epoch = await behind.register_broker(1, "127.0.0.1", 9001)
            e2 = await direct.register_broker(2, "127.0.0.1", 9002)
            epoch = await direct.try_become_controller(2, e2)
            await direct.create_topic("gone", uuid.uuid4().bytes, {0: [1, 2]}, {}, epoch)
            await until(lambda: "gone" in behind.image.topics, "behind sees the first topic")

            session = behind.client_id()
            proxy.cut()                                       # partitioned away...
            await until(lambda: behind.state == "SUSPENDED", "behind notices the lost connection")
            # ...while the cluster moves on, and its session is expired
            await direct.delete_topic("gone", epoch)
            await direct.create_topic("new", uuid.uuid4().bytes, {0: [2, 1]}, {"retention.ms": "1"}, epoch)
            kazoo_client(coordination.servers, client_id=session).stop()
            await until(lambda: 1 not in direct.image.brokers, "the expired session's registration is gone")
            assert behind.image.topics.keys() == {"gone"}, "no news while partitioned"

            proxy.mend()
            await until(lambda: behind.state == "CONNECTED" and "LOST" in states, "a new session after LOST")
            assert behind.broker_epoch is not None and behind.broker_epoch > old_epoch
            await until(lambda: direct.image.broker_epoch(1) == behind.broker_epoch, "registered again")
            await until(lambda: _same_view(behind.image, direct.image), "the image rebuilt by a full read")
            assert set(behind.image.topics) == {"new"} and "gone" in behind.image.deleting
            # and its watches work again
            await direct.create_topic("later", uuid.uuid4().bytes, {0: [1]}, {}, epoch)
            await until(lambda: "later" in behind.image.topics, "a watch set by the rebuild fires")
        finally:
            await _close(behind, direct)
            await proxy.close()

    run(body())


def test_store_survives_a_zookeeper_leader_change(ensemble):
    async def body():
        connect = ensemble.connect_string(f"/t-{uuid.uuid4().hex[:8]}")
        a, b = await _store(connect), await _store(connect)
        try:
            ea = await a.register_broker(1, "127.0.0.1", 9001)
            epoch = await a.try_become_controller(1, ea)
            await a.create_topic("t", uuid.uuid4().bytes, {0: [1]}, {}, epoch)
            leader = ensemble.leader()
            await asyncio.get_running_loop().run_in_executor(None, ensemble.kill, leader)
            # writes fail (StoreUnavailable) while the ensemble elects a new leader, then succeed: same session
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_s() + 60
            while True:
                s = a.image.partition("t", 0)
                try:
                    await a.write_partition_state("t", 0, PartitionState(1, 0, (1,), 0, 0), s.version, epoch)
                    break
                except StoreUnavailable:
                    assert loop.time() < deadline, "no write went through after the ZooKeeper leader change"
                    await asyncio.sleep(0.2)
                except StaleVersion:               # the write went through before the connection dropped
                    if (await a.read_partition_state("t", 0)).isr == (1,):
                        break
                    raise
            assert a.controller_epoch == epoch, "the session survived: the seat is still held"
            await until(lambda: b.image.partition("t", 0) == a.image.partition("t", 0), "b's watches still work",
                        timeout=wait_s())
        finally:
            await _close(a, b)

    run(body(), timeout=400)
