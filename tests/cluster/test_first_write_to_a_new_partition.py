"""The first acks=all write to a new partition is not held for a follower's long poll (replica.fetch.wait.max.ms).

A follower fetches all the partitions it follows from one leader in one request, parked at the leader until
data arrives or the long poll ends. A partition created meanwhile is not in that parked request, so without more
its first records reach no follower, and its first acks=all write is not acknowledged, until the poll ends. The
leader answers such a parked fetch at once when a write arrives for a partition that follower has not fetched yet
(cluster/replica_manager.py `appended`, broker/delayed.py `wake_replica`), and the follower asks again with it.

Here the long poll is LONG_POLL_MS: the followers' fetches are parked on an older topic just before the new topic
is created, so without the early answer its first write waits most of that time.
"""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.cluster_processes import partitions, produce, wait_for
from tests.integration.helpers import create_topic

NONE = 0
LONG_POLL_MS = 20000


def test_the_first_acks_all_write_to_a_new_partition_is_not_held_for_the_followers_long_poll(cluster_factory):
    c = cluster_factory(**{"replica.fetch.wait.max.ms": LONG_POLL_MS, "replica.socket.timeout.ms": 3 * LONG_POLL_MS,
                           "min.insync.replicas": 3})
    create_topic(c.bootstrap, "older", 1, replication_factor=3)
    wait_for(lambda: len(partitions(c, "older")[0].isr_nodes) == 3, "the older topic in sync")
    leader = partitions(c, "older")[0].leader_id
    # Every follower's fetch from `leader` answers with this write and parks again, for the whole long poll.
    assert produce(c, leader, "older", 0, [b"park"], acks=-1)[0] == NONE
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    replicas = [leader] + sorted(set(c.brokers) - {leader})
    admin.create_topics([NewTopic("newer", num_partitions=1, replica_assignment=[replicas])])["newer"].result(60)
    wait_for(lambda: all(partitions(c, "newer", n).get(0) is not None and partitions(c, "newer", n)[0].leader_id
                         == leader for n in c.brokers), "the new topic led by the same broker everywhere")
    started = time.monotonic()
    assert produce(c, leader, "newer", 0, [b"first"], acks=-1, timeout_ms=2 * LONG_POLL_MS) == (NONE, 0)
    took = time.monotonic() - started
    print(f"\nfirst acks=all write to a new partition (min ISR 3): {took * 1000:.0f} ms "
          f"(followers' long poll {LONG_POLL_MS} ms)")
    assert took < LONG_POLL_MS / 1000 / 2, "the write waited for the followers' parked fetches to end"
