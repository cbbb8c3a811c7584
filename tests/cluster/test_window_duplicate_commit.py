"""A leader answers DUPLICATE_SEQUENCE_NUMBER (46, which clients take as success) for a sequence whose batch is
still above its high watermark, without waiting for the ISR; a failover then loses the acknowledged record.

Found by the cluster fault run (`python -m tests.faults.runner --cluster --runs 6 --seed 1`, run 4: consumer
workload, oncelog client, seed 4). History excerpt (grp-b.jsonl, nemesis.jsonl; times are seconds mod 1000):
    919.800  grp-b send invoke grp-b:321 (grp-0, seq 321)
    919.808  nemesis broker-pause: broker 3 (leader of grp-0) SIGSTOPped for 8.88 s, past the 6 s session
    924.687  broker 1 leads grp-0 at epoch 1, log end 187, ISR [1, 2]
    928.69   broker 3 SIGCONT; it still leads grp-0 in its own image and serves what waited in its sockets
    928.699  grp-b send ok grp-b:321 offset -1             <- broker 3 answered 46
    928.765  broker 3 truncates grp-0 from 196 to 187 following broker 1
    final read: grp-b:321 is nowhere: a lost write (acks=all, acknowledged).
The window-duplicate rule (DESIGN.md §3 rule 3, KAFKA-12207) answers from the producer's last sequence, which
counts batches appended but not committed. An exact duplicate waits for acks=all like the original
(handlers/produce.py); a window duplicate must too: a 46 may only be answered once the high watermark passed
the producer's batches up to that sequence (or the leader must refuse, e.g. NOT_LEADER_OR_FOLLOWER, when it
loses the leadership meanwhile).

Here, deterministically: each broker behind a tests/faults proxy (advertised, so replica fetches go through it),
the links between the leader and its followers blackholed (the followers stay alive and, with a long
replica.lag.time.max.ms, in the ISR), the leader appends sequence 1 and five later batches that all time out
uncommitted (the 5-batch cache no longer holds sequence 1), the retry of sequence 1 gets 46 at once; the leader
is SIGKILLed, the links heal, a follower is elected, and the record answered 46 is not in its log.
"""

from __future__ import annotations

import time

import pytest
from kafka.protocol.producer import InitProducerIdRequest

from oncelog.embedded import ClusterProcess
from oncelog.records.builder import build_batch
from tests.cluster.cluster_processes import SETTINGS, START_S, partitions, wait_for
from tests.faults.proxy import FaultProxy
from tests.integration.helpers import ck_consume, create_topic, produce_raw
from tests.support.wire import Wire

NONE, REQUEST_TIMED_OUT, DUPLICATE_SEQUENCE_NUMBER = 0, 7, 46
TOPIC = "window-dup"


@pytest.fixture
def cluster(coordination_connect, tmp_path):
    proxies = {i: FaultProxy(upstream_port=0).start() for i in (1, 2, 3)}
    c = ClusterProcess(tmp_path / "cluster", 3, {**SETTINGS, "min.insync.replicas": 2,
                                                  "replica.lag.time.max.ms": 120_000,
                                                  "leader.imbalance.check.interval.seconds": 3600},
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


@pytest.mark.timeout(300)
def test_a_window_duplicate_is_not_acknowledged_before_its_batch_is_committed(cluster):
    c, proxies = cluster
    create_topic(c.bootstrap, TOPIC, 1, replication_factor=3)
    wait_for(lambda: sorted(partitions(c, TOPIC)[0].isr_nodes) == [1, 2, 3], "the ISR to be whole")
    leader = partitions(c, TOPIC)[0].leader_id
    followers = [n for n in c.brokers if n != leader]
    with Wire(c.brokers[leader].bootstrap, timeout=60) as w:
        init = w.request(InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000,
                                                  producer_id=-1, producer_epoch=-1), 4)
        pid, epoch = init.producer_id, init.producer_epoch

        def batch(seq: int) -> bytearray:
            return build_batch([(None, f"seq-{seq}".encode(), (), int(time.time() * 1000))], producer_id=pid,
                               producer_epoch=epoch, base_sequence=seq)

        assert produce_raw(w, TOPIC, 0, batch(0), timeout_ms=30_000).error_code == NONE  # committed at offset 0
        first = batch(1)
        for f in followers:  # the leader's answers to their fetches never arrive, nor their next fetches
            proxies[leader].set_link([f], "blackhole")
            proxies[f].set_link([leader], "blackhole")
        answers = [produce_raw(w, TOPIC, 0, first, timeout_ms=300).error_code]
        for seq in range(2, 7):  # five later batches: sequence 1 leaves the leader's 5-batch cache
            answers.append(produce_raw(w, TOPIC, 0, batch(seq), timeout_ms=300).error_code)
        assert answers == [REQUEST_TIMED_OUT] * 6, answers  # appended, never committed: nothing replicates
        retry = produce_raw(w, TOPIC, 0, first, timeout_ms=300).error_code
    c.kill(leader)
    for p in proxies.values():
        p.clear_links()
    wait_for(lambda: partitions(c, TOPIC, via=followers[0])[0].leader_id in followers, "a follower to lead")

    def read() -> list[str]:
        return [r.value.decode() for r in ck_consume(",".join(proxies[f].address for f in followers), TOPIC,
                                                     {0: 0}, timeout=60)]

    # The followers may not have learned the high watermark past seq-0 before the links were cut: the new leader's
    # moves past it once the other follower fetches from it, and until then a read ends (EOF) before offset 0.
    values = wait_for(lambda: (v := read()) and "seq-0" in v and v, "seq-0 below the new leader's high watermark")
    if retry in (NONE, DUPLICATE_SEQUENCE_NUMBER):  # a success for every client
        assert "seq-1" in values, f"sequence 1 was answered {retry} and is not in the new leader's log {values}"
