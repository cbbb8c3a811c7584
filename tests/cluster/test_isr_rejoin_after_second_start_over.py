"""A follower whose log starts over twice in a row under the same leader (its first start-over asked for the
leader's producer state; before its next fetch DeleteRecords moved the log start again) rejoins the ISR.

Found by the cluster fault run (tests/faults/test_cluster_fault_runs.py, idempotent workload, seed 21): broker 2
was cut from broker 1 (leader of idem-2) for 10 s while the deleter moved idem-2's log start. Broker 2's log
(times in seconds):
    16.745  idem-2: log end 1229 below the leader's log start 2805: starting over there
    16.781  idem-2: producer state at offset 3071 from broker 1 (422 bytes); log end 2805
    16.793  idem-2: log end 2805 below the leader's log start 3071: starting over there
    16.819  idem-2: installed the producer state of broker 1 at offset 3071 (2 producers)
and then it fetched at and past 3071 for the rest of the run, but stayed out of the ISR ([1, 3] 54 s after the
heal). The second fetch below the log start made the leader forget the offset it had served the state at (its
gate waits for a fetch at or past that offset), while the follower kept that state (it is above where it starts
over, so valid) and never asked again: the gate could no longer open (docs/cluster.md §4.7, ISR gate).

Here, deterministically: brokers behind tests/faults proxies, partition led by broker 1 on [1, 2, 3]. Broker 3 is
SIGKILLed (its session expires, the controller takes it out of the ISR) with its log ending at 10; records 10-19
are written and deleted up to 15. Broker 2's links to the leader are blackholed (a long replica.lag.time.max.ms
keeps it in the ISR): the high watermark stays at 20 while 20-24 are appended with acks=1. Broker 3 restarts,
fetches at 10, starts over at 15 and asks for the producer state, which the leader takes at 25 and answers only
once 25 is committed, i.e. not while broker 2 stalls. Meanwhile DeleteRecords moves the leader's log start to 20.
Then broker 2's links heal: the state is answered, broker 3 fetches at 15, starts over at 20 keeping it, installs
it at 25 and fetches on; it must be back in the ISR.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DeleteRecordsRequest

from oncelog.embedded import ClusterProcess
from oncelog.storage.checkpoints import read_checkpoint
from tests.cluster.cluster_processes import SETTINGS, START_S, converge_s, partitions, produce, wait_for
from tests.faults.proxy import FaultProxy
from tests.support.wire import Wire

NONE, REQUEST_TIMED_OUT = 0, 7
TOPIC = "start-over-twice"
LEADER, STALLED, RESTARTED = 1, 2, 3
LAG_MS = 120_000  # the stalled follower stays in the ISR: the high watermark waits for it


@pytest.fixture
def cluster(coordination_connect, tmp_path):
    proxies = {i: FaultProxy(upstream_port=0).start() for i in (1, 2, 3)}
    c = ClusterProcess(tmp_path / "cluster", 3, {**SETTINGS, "replica.lag.time.max.ms": LAG_MS},
                       broker_settings={i: {"advertised.listeners": p.address} for i, p in proxies.items()},
                       connect=coordination_connect)
    try:
        c.start(START_S)
        for i, b in c.brokers.items():
            proxies[i].upstream_port = b.port
        yield c, proxies
    finally:
        c.kill_all()
        for p in proxies.values():
            p.stop()


def delete_records(c: ClusterProcess, before: int, timeout_ms: int) -> tuple[int, int]:
    """DeleteRecords on the leader: (error code, low watermark)."""
    req = DeleteRecordsRequest[2]
    with Wire(c.brokers[LEADER].bootstrap, timeout=timeout_ms / 1000 + 30) as w:
        resp = w.request(req(topics=[req.DeleteRecordsTopic(name=TOPIC, partitions=[
            req.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=before)])],
            timeout_ms=timeout_ms), 2)
    (p,) = resp.topics[0].partitions
    return p.error_code, p.low_watermark


def log_start(c: ClusterProcess, node: int) -> int | None:
    """The log start offset broker `node` has checkpointed for the partition (on disk, so read from outside)."""
    return read_checkpoint(c.brokers[node].data_dir / "log-start-offset-checkpoint").get((TOPIC, 0))


def isr(c: ClusterProcess) -> list[int]:
    p = partitions(c, TOPIC, via=LEADER)[0]
    assert p.leader_id == LEADER, p
    return sorted(p.isr_nodes)


@pytest.mark.timeout(300)
def test_a_follower_that_starts_over_twice_rejoins_the_isr(cluster):
    c, proxies = cluster
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[LEADER, STALLED, RESTARTED]])]
                        )[TOPIC].result(converge_s())
    wait_for(lambda: isr(c) == [1, 2, 3], "the whole ISR")
    assert produce(c, LEADER, TOPIC, 0, [b"a%d" % i for i in range(10)]) == (NONE, 0)

    c.kill(RESTARTED)
    wait_for(lambda: isr(c) == [1, 2], "broker 3 out of the ISR (its session expired)")
    assert produce(c, LEADER, TOPIC, 0, [b"b%d" % i for i in range(10)]) == (NONE, 10)
    assert delete_records(c, 15, timeout_ms=int(converge_s() * 1000)) == (NONE, 15)

    # Broker 2 stalls: nothing passes between it and the leader, and it stays in the ISR, so the high watermark
    # stays at 20 while 20-24 are appended.
    proxies[LEADER].set_link([STALLED], "blackhole")
    proxies[STALLED].set_link([LEADER], "blackhole")
    assert produce(c, LEADER, TOPIC, 0, [b"c%d" % i for i in range(5)], acks=1) == (NONE, 20)

    c.start_broker(RESTARTED, timeout=START_S)
    wait_for(lambda: log_start(c, RESTARTED) == 15, "broker 3 to start over at the leader's log start 15")
    # Broker 3 now waits for the producer state at 25, answered once 25 is committed (not while broker 2
    # stalls). The leader's log start moves to 20 at once; broker 2 cannot confirm it, hence the timeout.
    assert delete_records(c, 20, timeout_ms=500) == (REQUEST_TIMED_OUT, -1)
    assert isr(c) == [1, 2]

    for p in proxies.values():
        p.clear_links()
    # Broker 2 fetches again (the high watermark reaches 25, the state is answered), broker 3 fetches at 15,
    # starts over at 20 with the state it holds, installs it at 25 and fetches on. Bounded by the cluster's
    # convergence time, far above the few fetch rounds and replica.fetch.backoff.ms this takes.
    wait_for(lambda: isr(c) == [1, 2, 3], "broker 3 back in the ISR after starting over twice")
    assert log_start(c, RESTARTED) == 20  # the second start-over did happen
