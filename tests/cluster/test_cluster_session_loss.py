"""A leader cut off from ZooKeeper (docs/cluster.md §5.4), with broker processes: its link to ZooKeeper goes
through a TCP relay the test cuts while clients and the other brokers still reach it.

While cut, it acknowledges acks=all only within its lease (session timeout × 2/3 after its last confirmed round
trip); its session expires, the controller elects another leader; when the link returns the broker registers again
with a new session, follows the new leader (cutting any tail the new leader does not have), and returns to the
ISR. Nothing acknowledged is lost or doubled. Long run: `make cluster-test`.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from kafka.protocol.consumer import FetchRequest

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import (
    SESSION_MS,
    SETTINGS,
    START_S,
    converge_s,
    partitions,
    produce,
    request,
    wait_for,
)
from tests.cluster.tcp_proxy import TcpProxy

pytestmark = pytest.mark.cluster_slow

NONE = 0


class RelayThread:
    """A TcpProxy on an event loop of its own thread, cut and mended from the test's thread."""

    def __init__(self, host: str, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = self._call(TcpProxy(host, port).start())

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def cut(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.cut)

    def mend(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.mend)

    def close(self) -> None:
        self._call(self.proxy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def relay(coordination):
    relay = RelayThread(coordination.member.host, coordination.port)
    yield relay
    relay.close()


def read(c: ClusterProcess, node: int, topic: str) -> list[bytes]:
    """Every record of partition 0 up to the high watermark, fetched from broker `node` (its leader)."""
    from kafka.record import MemoryRecords

    req = FetchRequest[12]
    ft, fp = req.FetchTopic, req.FetchTopic.FetchPartition
    resp = request(c, node, req(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 24, isolation_level=0,
                                session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                                topics=[ft(topic=topic, partitions=[fp(
                                    partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 24,
                                    current_leader_epoch=-1, last_fetched_epoch=-1)])]), 12)
    (p,) = resp.responses[0].partitions
    assert p.error_code == NONE, p.error_code
    records = MemoryRecords(bytes(p.records or b""))
    out = []
    while batch := records.next_batch():
        out += [r.value for r in batch]
    return out


def test_a_leader_cut_from_zookeeper_stops_acknowledging_and_rejoins_as_follower(coordination_connect, relay,
                                                                              tmp_path):
    chroot = coordination_connect[coordination_connect.index("/"):]
    c = ClusterProcess(tmp_path / "cluster", 3, SETTINGS, connect=coordination_connect,
                       broker_settings={1: {"oncelog.coordination.connect": relay.proxy.address + chroot}})
    c.start(START_S)
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("cut", num_partitions=1, replica_assignment=[[1, 2, 3]],
                                      config={"min.insync.replicas": "2"})])["cut"].result(60)
        before = partitions(c, "cut")[0]
        assert before.leader_id == 1
        acknowledged = [b"before-%d" % i for i in range(5)]
        for value in acknowledged:
            assert produce(c, 1, "cut", 0, [value])[0] == NONE

        relay.cut()
        # Past its lease the cut-off leader acknowledges nothing, whatever its followers do.
        time.sleep(SESSION_MS / 1000 * 2 / 3 + 1)
        late = produce(c, 1, "cut", 0, [b"late"], timeout_ms=int(SESSION_MS * 1.5))
        assert late[0] != NONE, f"acknowledged {late} after the lease ran out"
        # Its session expires: the controller elects another in-sync replica at a newer leader epoch.
        after = wait_for(lambda: (p := partitions(c, "cut", via=2)[0]).leader_id in (2, 3) and p,
                         "another leader")
        assert after.leader_epoch > before.leader_epoch and 1 not in after.isr_nodes
        for i in range(5):
            value = b"after-%d" % i
            assert produce(c, after.leader_id, "cut", 0, [value])[0] == NONE
            acknowledged.append(value)

        relay.mend()
        # A new session, a new registration: it follows the new leader, cuts what nobody acknowledged, rejoins.
        wait_for(lambda: sorted(partitions(c, "cut", via=2)[0].isr_nodes) == [1, 2, 3], "broker 1 back in the ISR",
                 converge_s() + 30)
        log = c.brokers[1].log_tail(400)
        assert "registering again" in log or "new ZooKeeper session" in log
        got = read(c, partitions(c, "cut")[0].leader_id, "cut")
        # Every acknowledged record, in order, once. The unacknowledged "late" one may be there too: the followers
        # may have copied it before they learned of the election (its writer was told it failed, not that it
        # was not written, as in Kafka).
        assert [v for v in got if v != b"late"] == acknowledged and got.count(b"late") <= 1
        # Broker 1 leads again (preferred election) and serves the same log as the leader it followed.
        from kafka.admin import KafkaAdminClient

        KafkaAdminClient(bootstrap_servers=c.bootstrap).elect_leaders(0, {"cut": [0]})
        wait_for(lambda: partitions(c, "cut")[0].leader_id == 1, "broker 1 to lead again", 30)
        assert read(c, 1, "cut") == got
    finally:
        c.kill_all()
