"""Ensemble: three ZooKeeper members on loopback; replication, and acknowledged writes through a member's SIGKILL."""

from __future__ import annotations

import os
import time
import uuid

import pytest

SESSION_TIMEOUT_S = 10.0               # the test clients' ZooKeeper session
WRITE_DEADLINE_S = 6 * SESSION_TIMEOUT_S   # one write, retried across a leader election
WRITES = 200


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_members_replicate_and_elect_one_leader(ensemble, kazoo_client):
    assert ensemble.servers == ",".join(f"127.0.0.1:{m.client_port}" for m in ensemble.members)
    assert len({p for m in ensemble.members for p in (m.client_port, m.quorum_port, m.election_port)}) == 9
    assert sorted(m.mode() for m in ensemble.members) == ["follower", "follower", "leader"]
    assert ensemble.member(ensemble.leader()).mode() == "leader"

    path = f"/replicated-{uuid.uuid4().hex[:8]}"
    kazoo_client(ensemble.member(1).address).create(path, b"through member 1")
    for member_id in (2, 3):
        client = kazoo_client(ensemble.member(member_id).address)
        client.sync(path)
        assert client.get(path)[0] == b"through member 1"
    assert kazoo_client(ensemble.connect_string(path)).get("/")[0] == b"through member 1"


@pytest.mark.cluster_slow
@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_acknowledged_writes_survive_a_member_sigkill(ensemble, kazoo_client, victim):
    from kazoo.exceptions import NodeExistsError
    from kazoo.retry import KazooRetry

    root = f"/faults-{victim}-{uuid.uuid4().hex[:8]}"
    kazoo_client(ensemble.member(1).address).create(f"{root}/before", b"before", makepath=True)
    leader = ensemble.leader()
    killed = leader if victim == "leader" else next(m.member_id for m in ensemble.members
                                                    if m.member_id != leader)
    survivors = [m.member_id for m in ensemble.members if m.member_id != killed]
    client = kazoo_client(ensemble.servers, timeout=SESSION_TIMEOUT_S)
    client.sync(root)

    pid = ensemble.pid(killed)
    ensemble.kill(killed)
    t_kill = time.monotonic()
    assert _gone(pid)

    retry = KazooRetry(max_tries=-1, delay=0.1, backoff=1.5, max_delay=1.0, deadline=WRITE_DEADLINE_S)
    written: dict[str, bytes] = {}
    first_ack = None
    for i in range(WRITES):
        path, value = f"{root}/n{i:04d}", f"value-{i}".encode()
        try:
            retry(client.create, path, value)
        except NodeExistsError:      # an attempt was applied and its answer lost with the connection
            pass
        first_ack = first_ack or time.monotonic() - t_kill
        written[path] = value
    assert not ensemble.member(killed).alive(), "the writes ran while the member was down"
    print(f"\n[{victim} {killed} killed] first write acknowledged after {first_ack:.2f} s, "
          f"{WRITES} in {time.monotonic() - t_kill:.2f} s")
    if victim == "leader":
        assert ensemble.leader(exclude=(killed,)) in survivors

    expected_children = sorted(["before", *(p.rsplit("/", 1)[1] for p in written)])
    for member_id in survivors:
        reader = kazoo_client(ensemble.member(member_id).address)
        reader.sync(root)
        assert sorted(reader.get_children(root)) == expected_children, f"member {member_id}"
        assert all(reader.get(path)[0] == value for path, value in written.items()), f"member {member_id}"

    ensemble.restart(killed)
    assert sorted(m.mode() for m in ensemble.members) == ["follower", "follower", "leader"]
    # No sync: the restarted member itself must hold every write made while it was down.
    rejoined = kazoo_client(ensemble.member(killed).address)
    assert sorted(rejoined.get_children(root)) == expected_children
    assert all(rejoined.get(path)[0] == value for path, value in written.items())


def test_revive_starts_the_members_that_are_down(ensemble, kazoo_client):
    """What the `ensemble` fixture does before each test: members a test left down run again, on their ports."""
    ports = [m.client_port for m in ensemble.members]
    ensemble.kill(2)
    ensemble.stop_member(3)
    assert [m.alive() for m in ensemble.members] == [True, False, False]
    ensemble.revive()
    assert all(m.alive() for m in ensemble.members)
    assert [m.client_port for m in ensemble.members] == ports
    assert sorted(m.mode() for m in ensemble.members) == ["follower", "follower", "leader"]
    assert kazoo_client(ensemble.member(3).address).exists("/zookeeper") is not None
