"""The controller seat on a ZooKeeper session of its own (`oncelog.controller.session.timeout.ms`, docs/cluster.md
§5.1), with broker processes: a SIGKILLed controller is replaced after the seat session's timeout, not the broker
session's; a SIGSTOPped one is replaced the same way and, woken, acts on nothing (its writes fail on the
controller-epoch check); a controller session the broker session cannot hold is refused at start.

The brokers run with a broker session far longer than the seat's, so a seat that rode the broker session would
fail the bounds below, which are the broker session timeout.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DescribeClusterRequest

from oncelog.config import MIN_CONTROLLER_SESSION_MS
from oncelog.embedded import BrokerProcess, ClusterProcess
from tests.cluster.cluster_processes import SETTINGS, converge_s, partitions, request, wait_for

NONE = 0
BROKER_SESSION_MS = 20000          # the seat must not wait for this
CONTROLLER_SESSION_MS = 1500       # the default


def _cluster(cluster_factory) -> ClusterProcess:
    # The crash probe off: a dead controller's broker must keep its registration here, so that only the seat
    # session can explain how fast a new controller sits.
    return cluster_factory(**{"oncelog.coordination.session.timeout.ms": BROKER_SESSION_MS,
                              "oncelog.controller.broker.probe.interval.ms": 0})


def _described_controller(c: ClusterProcess, node: int) -> int:
    return request(c, node, DescribeClusterRequest[0](include_cluster_authorized_operations=False), 0,
                   timeout=10).controller_id


def _create(c: ClusterProcess, node: int, name: str, timeout_s: float) -> int:
    req = CreateTopicsRequest[7]
    resp = request(c, node, req(topics=[req.CreatableTopic(name=name, num_partitions=2, replication_factor=2,
                                                           assignments=[], configs=[])],
                                timeout_ms=int(timeout_s * 1000), validate_only=False), 7, timeout=timeout_s + 10)
    return resp.topics[0].error_code


def _znode(zk, path: str) -> dict:
    return json.loads(zk.get(path)[0])


def test_a_killed_controller_is_replaced_after_the_seat_session_not_the_broker_session(cluster_factory):
    c = _cluster(cluster_factory)
    old = c.controller()
    via = next(n for n in sorted(c.brokers) if n != old)
    assert _create(c, via, "before", 30) == NONE
    c.kill(old)
    killed = time.monotonic()
    # The first CreateTopics sent after the kill: forwarded once a new controller sits, within its deadline.
    assert _create(c, via, "after", converge_s(BROKER_SESSION_MS)) == NONE
    created = time.monotonic() - killed
    new = wait_for(lambda: (n := c.controller(via)) not in (old, -1) and n, "a new controller named by Metadata")
    named = time.monotonic() - killed
    assert new != old and _described_controller(c, via) == new
    print(f"\ncontroller SIGKILL -> topic created {created:.2f} s, new controller named {named:.2f} s "
          f"(seat session {CONTROLLER_SESSION_MS} ms, broker session {BROKER_SESSION_MS} ms)")
    assert created < BROKER_SESSION_MS / 1000 and named < BROKER_SESSION_MS / 1000
    # The dead broker is still registered (its broker session lives on): only its seat went.
    assert old in {b.node_id for b in c.metadata(via, []).brokers}
    assert sorted(partitions(c, "after", via=via)) == [0, 1]


def test_a_paused_controller_loses_the_seat_and_is_fenced_when_it_wakes(cluster_factory, coordination_connect,
                                                                         kazoo_client):
    c = _cluster(cluster_factory)
    zk = kazoo_client(coordination_connect)
    old = c.controller()
    others = [n for n in sorted(c.brokers) if n != old]
    epoch = _znode(zk, "/controller_epoch")["controller_epoch"]
    pid = c.brokers[old].proc.pid
    os.kill(pid, signal.SIGSTOP)
    paused = time.monotonic()
    answers: dict[str, int] = {}
    try:
        # Sent through another broker at once: forwarded to the paused controller its image still names, given up
        # there when the image names the new one, and carried out by that one while the old one still sleeps.
        forwarded = threading.Thread(target=lambda: answers.update(
            forwarded=_create(c, others[1], "while-paused", BROKER_SESSION_MS / 1000)))
        forwarded.start()
        # Sent to the paused controller itself: it waits in its socket until it wakes.
        sent_to_paused = threading.Thread(target=lambda: answers.update(
            waited=_create(c, old, "sent-to-the-paused-one", converge_s(BROKER_SESSION_MS))))
        sent_to_paused.start()
        new = wait_for(lambda: (n := c.controller(others[0])) not in (old, -1) and n,
                       "a new controller while the old one sleeps", BROKER_SESSION_MS / 1000)
        replaced = time.monotonic() - paused
        forwarded.join(BROKER_SESSION_MS / 1000 - (time.monotonic() - paused) - 1)
        assert answers.get("forwarded") == NONE, "the forwarded request waited for the paused controller"
        answered = time.monotonic() - paused
        assert answered < BROKER_SESSION_MS / 1000, "the old broker's session must not expire meanwhile"
        print(f"\ncontroller SIGSTOP -> new controller named {replaced:.2f} s, forwarded topic created by "
              f"{answered:.2f} s")
    finally:
        os.kill(pid, signal.SIGCONT)
    sent_to_paused.join(converge_s(BROKER_SESSION_MS) + 20)
    assert answers == {"forwarded": NONE, "waited": NONE}
    seat = _znode(zk, "/controller")
    new_epoch = _znode(zk, "/controller_epoch")["controller_epoch"]
    assert seat["broker_id"] == new and seat["controller_epoch"] == new_epoch > epoch
    # The request the old controller held was carried out by a newer one: no state carries the old epoch.
    for p in (0, 1):
        state = _znode(zk, f"/topics/sent-to-the-paused-one/partitions/{p}/state")
        assert epoch < state["controller_epoch"] <= new_epoch
    # Woken, the old broker names the new controller, as every broker does, and agrees on every topic.
    for n in sorted(c.brokers):
        wait_for(lambda n=n: c.controller(n) == new and _described_controller(c, n) == new,
                 f"broker {n} to name controller {new}", converge_s(BROKER_SESSION_MS))

    def view(n: int) -> dict:
        return {t: {p: (s.leader_id, s.leader_epoch, sorted(s.replica_nodes)) for p, s in partitions(c, t, n).items()}
                for t in ("sent-to-the-paused-one", "while-paused")}

    wait_for(lambda: view(old) == view(others[0]) == view(others[1]), "the same metadata on every broker")
    assert all(len(parts) == 2 for parts in view(old).values())
    # It kept its registration (its broker session outlived the pause) and does not act as controller: a request
    # sent to it now is carried out by the new controller, at the new epoch.
    assert old in {b.node_id for b in c.metadata(others[0], []).brokers}
    assert _create(c, old, "after-waking", 30) == NONE
    assert _znode(zk, "/topics/after-waking/partitions/0/state")["controller_epoch"] == new_epoch
    assert _znode(zk, "/controller_epoch")["controller_epoch"] == new_epoch, "the woken one never took the seat"


@pytest.mark.parametrize(("value", "problem"), [
    (MIN_CONTROLLER_SESSION_MS - 1, f"must be at least {MIN_CONTROLLER_SESSION_MS}"),
    (SETTINGS["oncelog.coordination.session.timeout.ms"] + 1,
     f"must be at most oncelog.coordination.session.timeout.ms ({SETTINGS['oncelog.coordination.session.timeout.ms']})"),
])
def test_a_controller_session_out_of_bounds_is_refused(tmp_path, value, problem):
    broker = BrokerProcess(tmp_path / "broker", {**SETTINGS, "node.id": 1,
                                                 "oncelog.coordination.connect": "127.0.0.1:1/unused",
                                                 "oncelog.controller.session.timeout.ms": value})
    with pytest.raises(RuntimeError, match=r"exited during startup \(code 2\)"):
        broker.start(timeout=30)
    assert (f"configuration error: Invalid value '{value}' for configuration oncelog.controller.session.timeout.ms: "
            f"{problem}") in broker.log_tail()
