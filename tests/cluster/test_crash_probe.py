"""The controller's crash probe (cluster/crash_probe.py, docs/cluster.md §5.2), with broker processes on ZooKeeper.

The brokers run with a broker session of BROKER_SESSION_MS, far longer than anything the probe needs, so each
bound below fails if the death waits for the session: a SIGKILLed broker leaves Metadata, its leaderships move
and acks=all produce works again before its session could expire; a SIGSTOPped one (its kernel still accepts
connections) keeps its registration and its epoch; a live broker whose registration is removed registers again
under a new epoch and rejoins the ISR. That a leaving broker does not register again is tested on the store
itself (test_metadata_store.py::test_a_removed_registration_is_renewed_unless_the_broker_is_leaving): from a
process, the window between its listener closing and its session ending is too short to hit on purpose.
"""

from __future__ import annotations

import json
import os
import signal
import time

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import converge_s, partitions, produce, wait_for

NONE = 0
BROKER_SESSION_MS = 30000
PROBE_MS = 500


def _cluster(cluster_factory) -> ClusterProcess:
    return cluster_factory(**{"oncelog.coordination.session.timeout.ms": BROKER_SESSION_MS,
                              "oncelog.controller.broker.probe.interval.ms": PROBE_MS})


def _registered(c: ClusterProcess, via: int) -> set[int]:
    return {b.node_id for b in c.metadata(via, []).brokers}


def _epoch(zk, node: int) -> int:
    return zk.get(f"/brokers/ids/{node}")[1].czxid


def _create_rf3(c: ClusterProcess, topic: str) -> None:
    from kafka.protocol.admin import CreateTopicsRequest

    from tests.cluster.cluster_processes import request
    req = CreateTopicsRequest[7]
    resp = request(c, c.controller(), req(
        topics=[req.CreatableTopic(name=topic, num_partitions=3, replication_factor=3, assignments=[],
                                   configs=[req.CreatableTopic.CreatableTopicConfig(name="min.insync.replicas",
                                                                                     value="2")])],
        timeout_ms=30000, validate_only=False), 7, timeout=40)
    assert resp.topics[0].error_code == NONE
    wait_for(lambda: all(len(p.isr_nodes) == 3 for p in partitions(c, topic).values())
             and len(partitions(c, topic)) == 3, "every replica in sync")


def test_a_sigkilled_broker_is_declared_dead_long_before_its_session_expires(cluster_factory):
    c = _cluster(cluster_factory)
    _create_rf3(c, "t")
    controller = c.controller()
    victim = next(n for n in sorted(c.brokers) if n != controller)
    led = sorted(p for p, s in partitions(c, "t", controller).items() if s.leader_id == victim)
    assert led, "the preferred leaders spread over the three brokers"
    c.kill(victim)
    killed = time.monotonic()
    wait_for(lambda: victim not in _registered(c, controller), "the dead broker gone from Metadata",
             BROKER_SESSION_MS / 1000)
    gone = time.monotonic() - killed
    moved = wait_for(lambda: all(s.leader_id not in (victim, -1) and victim not in s.isr_nodes
                                 for s in partitions(c, "t", controller).values()) and time.monotonic() - killed,
                     "its leaderships moved and the ISRs shrunk", BROKER_SESSION_MS / 1000)
    for p in led:
        leader = partitions(c, "t", controller)[p].leader_id
        assert produce(c, leader, "t", p, [b"after"], acks=-1) == (NONE, 0)
    acked = time.monotonic() - killed
    print(f"\nbroker SIGKILL -> gone from Metadata {gone:.2f} s, leaders moved {moved:.2f} s, acks=all produced "
          f"{acked:.2f} s (probe every {PROBE_MS} ms, broker session {BROKER_SESSION_MS} ms)")
    assert acked < BROKER_SESSION_MS / 1000, "the death waited for the session"


def test_a_paused_broker_keeps_its_registration_and_epoch(cluster_factory, coordination_connect, kazoo_client):
    c = _cluster(cluster_factory)
    zk = kazoo_client(coordination_connect)
    controller = c.controller()
    victim = next(n for n in sorted(c.brokers) if n != controller)
    before = _epoch(zk, victim)
    pid = c.brokers[victim].proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # Ten probe rounds: a probe that counted a paused process's silence as a refusal acts within two.
        deadline = time.monotonic() + 10 * PROBE_MS / 1000
        while time.monotonic() < deadline:
            assert victim in _registered(c, controller), "a paused broker was declared dead"
            time.sleep(PROBE_MS / 1000 / 2)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert _epoch(zk, victim) == before
    assert victim in _registered(c, controller)


def test_a_live_broker_whose_registration_is_removed_registers_again(cluster_factory, coordination_connect,
                                                                     kazoo_client):
    c = _cluster(cluster_factory)
    _create_rf3(c, "t")
    zk = kazoo_client(coordination_connect)
    controller = c.controller()
    victim = next(n for n in sorted(c.brokers) if n != controller)
    before = _epoch(zk, victim)
    zk.delete(f"/brokers/ids/{victim}")         # what the probe does to a broker it takes for dead
    after = wait_for(lambda: zk.exists(f"/brokers/ids/{victim}") and _epoch(zk, victim),
                     "the broker registered again", converge_s())
    assert after > before
    assert json.loads(zk.get(f"/brokers/ids/{victim}")[0])["port"] == c.brokers[victim].port
    # Treated as a restart: out of the ISRs, back in once caught up; acks=all with every replica works.
    wait_for(lambda: all(len(s.isr_nodes) == 3 and s.leader_id != -1 for s in partitions(c, "t", controller).values()),
             "the renewed broker back in every ISR", converge_s())
    for p, s in partitions(c, "t", controller).items():
        assert produce(c, s.leader_id, "t", p, [b"x"], acks=-1)[0] == NONE
    assert victim in _registered(c, controller) and victim in _registered(c, victim)
