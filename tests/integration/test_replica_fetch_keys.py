"""Keys of a follower's fetcher (issue 21's audit).

replica.fetch.max.bytes and replica.fetch.response.max.bytes bound what a follower asks for in one fetch: a follower
added to a partition that holds 20 batches catches up in one fetch by default, and in 20 when either bound is below
one batch (a fetch still carries one whole batch, as in Kafka). replica.fetch.backoff.ms and replica.socket.timeout.ms
pace the follower's connections to a leader that drops or ignores them (a plain TCP listener registered as the
leader). Real brokers over TCP, the metadata image fed by hand (tests/integration/test_replication.py).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from tests.integration.test_replication import T, batch, cluster, produce, wait_for  # noqa: F401 - the fixture

from oncelog.cluster.metadata_image import BrokerInfo


def leader_fetches(c) -> float:
    registry = c.nodes[1].broker.metrics.registry
    return c.call(lambda: registry.get_sample_value("oncelog_requests_total", {"api": "FETCH"}) or 0.0)


@pytest.mark.parametrize(("settings", "fewest", "most"), [
    ({}, 1, 3),
    ({"replica.fetch.max.bytes": 1}, 20, None),
    ({"replica.fetch.response.max.bytes": 1}, 20, None),
])
def test_fetch_bounds_of_a_catching_up_follower(cluster, settings, fewest, most):  # noqa: F811 - the fixture
    c = cluster(nodes=2, settings=settings)
    c.create((1,))
    wait_for(lambda: c.call(lambda: T in c.nodes[1].broker.logs.topics), "the leader's copy")
    for i in range(20):
        assert produce(c.nodes[1], batch([b"%d" % i * 100]), acks=1) == (0, i)
    before = leader_fetches(c)
    c.reassign((1, 2))
    wait_for(lambda: c.call(lambda: T in c.nodes[2].broker.logs.topics
                            and c.nodes[2].log().log_end_offset == 20), "the follower to catch up")
    fetches = leader_fetches(c) - before
    assert fetches >= fewest
    if most is not None:
        assert fetches <= most


class SilentLeader:
    """A TCP listener registered in the image as the partition's leader: it accepts the follower's connections and
    either closes each at once (a leader that drops the connection) or, with `hold`, keeps it open without a word."""

    def __init__(self, hold: bool) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hold = hold
        self.accepted: list[float] = []
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            if self.hold:
                self.held.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def connections_in(c, hold: bool, seconds: float) -> int:
    """Broker 1 follows a leader (node 9) that is `SilentLeader`; how many connections it opens in `seconds`."""
    leader = SilentLeader(hold)
    try:
        c.call(c.image.apply_broker, BrokerInfo(9, "127.0.0.1", leader.port, None, 900))
        c.create((9, 1))
        wait_for(lambda: leader.accepted, "the follower's first connection")
        first = leader.accepted[0]
        time.sleep(seconds)
        return sum(1 for t in leader.accepted if t - first < seconds)
    finally:
        leader.close()


@pytest.mark.parametrize(("backoff_ms", "fewest", "most"), [(100, 10, 40), (1500, 1, 3)])
def test_replica_fetch_backoff_ms_spaces_reconnections(cluster, backoff_ms, fewest, most):  # noqa: F811
    c = cluster(nodes=1, settings={"replica.fetch.backoff.ms": backoff_ms})
    assert fewest <= connections_in(c, hold=False, seconds=3) <= most


@pytest.mark.parametrize(("timeout_ms", "fewest", "most"), [(500, 3, 6), (30000, 1, 1)])
def test_replica_socket_timeout_ms_gives_up_on_a_silent_leader(cluster, timeout_ms, fewest, most):  # noqa: F811
    """A request the leader never answers fails after replica.socket.timeout.ms; the follower then connects again
    (after replica.fetch.backoff.ms, 100 here)."""
    c = cluster(nodes=1, settings={"replica.socket.timeout.ms": timeout_ms})
    assert fewest <= connections_in(c, hold=True, seconds=3) <= most
