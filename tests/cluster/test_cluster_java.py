"""The Java client (kafka-clients, the one most users run) against three brokers: transactions whose partitions,
coordinator and group coordinator sit on different brokers commit and abort exactly, and sendOffsetsToTransaction
lands on the group's coordinator with the commit. Same scenario and checks as the single-node interop test (its
topic has replication factor 1, its partitions led by two brokers; the internal topics have 3 replicas)."""

from __future__ import annotations

import pytest

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import SETTINGS, START_S
from tests.interop.test_java_client import java_jar, run_java  # noqa: F401 - java_jar is a fixture


@pytest.fixture
def cluster(coordination_connect, tmp_path):
    c = ClusterProcess(tmp_path / "cluster", 3, {
        **SETTINGS, "transaction.state.log.num.partitions": 3, "offsets.topic.num.partitions": 3,
    }, connect=coordination_connect)
    yield c.start(START_S)
    c.kill_all()


def test_java_transactions_commit_visible_abort_invisible_on_a_cluster(java_jar, cluster):  # noqa: F811
    topic = "java-txn"
    run = run_java(java_jar, "txn", cluster.bootstrap, topic=topic, deadline_s=150)
    run.all_ok()
    c1 = {"0": [[o, f"c1-p0-{o}"] for o in range(4)], "1": [[o, f"c1-p1-{o}"] for o in range(4)]}
    assert run.value("commit1") == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert run.value("abort1") == [[5, 6, 7], [5, 6, 7]]
    assert run.value("offsets_while_open") == {"earliest": 0, "latest": 11, "last_stable": 9}
    assert run.value("read_committed_while_open") == c1
    assert run.value("offsets_after_commit") == {"earliest": 0, "latest": 12, "last_stable": 12}
    assert run.value("read_committed") == {"0": c1["0"] + [[9, "c2-p0-0"], [10, "c2-p0-1"]], "1": c1["1"]}
    assert run.value("group_offsets") == {f"{topic}-0": {"offset": 42, "metadata": "committed-in-txn"}}
    assert run.value("describe_txn_after")["state"] == "COMPLETE_COMMIT"
