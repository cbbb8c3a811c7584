"""A broker that led a partition for an epoch in which nothing was written, then follows the next leader, fetches
on (docs/cluster.md §4.4).

Becoming leader records (epoch, log end) in the leader-epoch cache. If leadership moves on before any batch of
that epoch, no other replica ever has the epoch, so the follower's first fetch (LastFetchedEpoch = that epoch)
gets DivergingEpoch at the end of the previous epoch, which is its own log end: nothing to cut. Kafka's
UnifiedLog.truncateTo drops the cache entries at or past the log end even then; without it the follower asked
again with the same empty epoch, forever, without fetching a record (a busy loop), until the leader took it out
of the ISR after replica.lag.time.max.ms. Found by test_cluster_restarts.py's leader rotation (each broker leads
in turn with no writes) when a check took longer than 30 s.
"""

from __future__ import annotations

import re

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import SETTINGS, START_S, converge_s, partitions, produce, wait_for
from tests.cluster.replica_logs import lead, wait_isr_whole, wait_replicas_agree

NOT_LEADER = 6


@pytest.fixture
def cluster(coordination_connect, tmp_path):
    c = ClusterProcess(tmp_path / "cluster", 3, SETTINGS, connect=coordination_connect).start(START_S)
    yield c
    c.kill_all()


def test_a_leader_that_wrote_nothing_in_its_epoch_follows_the_next_one(cluster):
    c = cluster
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic("brief", 1, 3)], operation_timeout=30)["brief"].result(60)
    wait_isr_whole(c, "brief")
    first = partitions(c, "brief")[0].leader_id
    wait_for(lambda: produce(c, first, "brief", 0, [b"a", b"b"]) == (0, 0), "the first write")
    brief, after = [n for n in (1, 2, 3) if n != first]
    kadmin = KafkaAdminClient(bootstrap_servers=c.bootstrap)
    try:
        lead(c, kadmin, "brief", [0], brief)   # a new epoch, nothing written in it
        lead(c, kadmin, "brief", [0], after)   # and the next: `brief` follows with an epoch no one else has
    finally:
        kadmin.close()
    state = partitions(c, "brief")[0]
    assert (state.leader_id, state.leader_epoch) == (after, 2)
    # acks=all waits for the whole ISR, `brief` included: answered only if it fetches again.
    # (The new leader may learn it leads a moment after the broker whose Metadata `lead` read: NOT_LEADER, again.)
    answer = wait_for(lambda: (r := produce(c, after, "brief", 0, [b"c"], timeout_ms=int(converge_s() * 1000)))[0]
                      != NOT_LEADER and r, "the new leader to take the write")
    assert answer == (0, 2)
    assert sorted(partitions(c, "brief")[0].isr_nodes) == [1, 2, 3]
    wait_replicas_agree(c, "brief", [0])
    log = c.brokers[brief].log_path.read_text()
    assert len(re.findall(r"brief-0: our log diverges", log)) <= 1, c.brokers[brief].log_tail(5)
