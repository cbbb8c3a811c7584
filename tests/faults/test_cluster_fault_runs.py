"""The short cluster fault runs (the consumer one is cluster_slow for now, see below): runs of the harness in cluster mode (tests/faults/cluster.py:
three brokers at replication factor 3 on a 3-member ZooKeeper ensemble, every cluster nemesis mixed), the
idempotent workload, the consumer-group workload and the transactional one, with oncelog's own client (the
consumer's batch that spanned a rebalance is fixed: tests/integration/client/test_consumer_rebalance_rewind.py),
must end with zero anomalies, and so must a short transactional run on the secured cluster (cluster_slow; `--secure`,
tests/faults/secure.py). `make faults CLUSTER=1 [SECURE=1] RUNS=N` is the long version.

Bounded: each run injects faults for FAULTS_CLUSTER_TEST_SECONDS (default 20) and then heals; 30-50 s each.
Skipped with the reason where ZooKeeper cannot run (no java, or its jars not resolved: make coordination-setup).
"""

from __future__ import annotations

import os

import pytest

from tests.faults.checker import ANOMALIES
from tests.faults.runner import CLUSTER_NEMESES, one_run

SECONDS = float(os.environ.get("FAULTS_CLUSTER_TEST_SECONDS", "20"))


@pytest.fixture(scope="module", autouse=True)
def _zookeeper_runtime():
    from oncelog.cluster.zookeeper_jars import CoordinationUnavailable, java_executable, zookeeper_classpath

    try:
        java_executable()
        zookeeper_classpath()
    except CoordinationUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.timeout(420)
@pytest.mark.parametrize("workload,seed,client", [
    # In `make test`. It was cluster_slow for a while: seed 21 left idem-2 under-replicated for good after the
    # heal (a follower whose log started over twice under one leader; fixed in cluster/replica_manager.py,
    # tests/cluster/test_isr_rejoin_after_second_start_over.py), which now also fails the run (`under_replicated`).
    ("idempotent", 21, "oncelog"),
    # cluster_slow: with confluent-kafka it failed once on 2 cores loaded by a parallel full-suite run (not
    # diagnosed; seeds 22 and 23 with oncelog's client and 22 with confluent-kafka passed since); in
    # `make cluster-test` / `make faults CLUSTER=1` until it has a longer record.
    pytest.param("consumer", 22, "oncelog", marks=pytest.mark.cluster_slow),
    # Issue 16: two transactional producers (aborts, stalls past the timeout), read_committed and
    # read_uncommitted readers and an LSO monitor, with the transaction coordinators' brokers among the targets.
    ("transactions", 23, "oncelog"),
    # cluster_slow: the exactly-once copy (read_committed, TxnOffsetCommit) drains its input after the faults,
    # so a run takes longer (about 45 s with 20 s of faults).
    pytest.param("eos-copy", 24, "oncelog", marks=pytest.mark.cluster_slow),
    # cluster_slow: a Spark driver (a JVM that needs 10-30 s before its first micro-batch) beside three brokers
    # and the ZooKeeper ensemble; about 2 minutes.
    pytest.param("spark", 25, "confluent", marks=pytest.mark.cluster_slow),
])
def test_short_cluster_fault_run_has_no_anomalies(workload, seed, client):
    result = one_run(workload, list(CLUSTER_NEMESES), seed, SECONDS, client, None, cluster=True)
    assert result.faults > 0, "the nemesis injected nothing"
    assert result.operations > 0, "the workload did nothing"
    found = {name: [a for rep in result.report.values() for a in rep.anomalies[name]] for name in ANOMALIES}
    assert not any(found.values()), {name: items[:3] for name, items in found.items() if items}


@pytest.mark.cluster_slow  # one more cluster run of 35-50 s: make cluster-test, not make test's budget
@pytest.mark.timeout(420)
def test_short_secured_cluster_fault_run_has_no_anomalies():
    """`--secure` (tests/faults/secure.py): SASL_SSL listeners with SCRAM-SHA-512 between the brokers, ACLs on,
    the transactional workload's clients a principal holding only its ACLs, every cluster nemesis mixed. Every
    broker's proxy must have seen both other brokers connect through it and attributed each connection to its
    broker (the inter-broker listener speaks TLS: the proxies learn the peer from its socket, and an unattributed
    connection would pass through every cut)."""
    result = one_run("transactions", list(CLUSTER_NEMESES), 26, SECONDS, "oncelog", None, cluster=True, secure=True)
    assert result.faults > 0, "the nemesis injected nothing"
    assert result.operations > 0, "the workload did nothing"
    found = {name: [a for rep in result.report.values() for a in rep.anomalies[name]] for name in ANOMALIES}
    assert not any(found.values()), {name: items[:3] for name, items in found.items() if items}
    proxies = result.notes["proxies"]
    assert all(len(p["peers"]) == 2 and p["unidentified"] == 0 for p in proxies.values()), proxies
