"""The PySpark exactly-once pipeline (`make demo`, shortened) on a three-broker oncelog cluster: the sink's
transactions span partitions led by every broker, the source reads from every leader, the repartition topic is
purged with DeleteRecords cluster-wide; the verdict must be exactly once. And `make demo CLUSTER=1`: the demo's own
cluster with a broker SIGKILLed mid-run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import SETTINGS, START_S
from tests.spark.session import require_spark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(coordination_connect, tmp_path):
    c = ClusterProcess(tmp_path / "cluster", 3, {
        **SETTINGS, "default.replication.factor": 3, "min.insync.replicas": 2, "num.partitions": 3,
        "transaction.state.log.num.partitions": 3, "offsets.topic.num.partitions": 3,
        "group.initial.rebalance.delay.ms": 0,
    }, connect=coordination_connect)
    yield c.start(START_S)
    c.kill_all()


def _demo(*args: str) -> str:
    require_spark()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-m", "oncelog.spark.demo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    return out


def test_the_demo_pipeline_is_exactly_once_on_a_cluster(cluster):
    out = _demo("--bootstrap", cluster.bootstrap, "--seconds", "6", "--rate", "1000")
    assert "EXACTLY ONCE: yes" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["duplicates"].split()[-1] == "0" and lines["losses"].split()[-1] == "0"


@pytest.mark.cluster_slow
def test_make_demo_cluster_kills_a_broker_mid_run_and_stays_exactly_once(zookeeper_runtime):
    """`make demo CLUSTER=1`, shortened: its own ZooKeeper and three brokers, the repartition topic's leader
    SIGKILLed a few seconds into the generation and restarted; the verdict must still be exactly once, and the
    kill must have happened while events were being written (the report names the broker)."""
    out = _demo("--cluster", "--seconds", "16", "--rate", "1000", "--kill-at", "4", "--restart-after", "8")
    assert "EXACTLY ONCE: yes" in out
    killed = [line for line in out.splitlines() if "SIGKILL broker" in line]
    assert len(killed) == 1 and any("restarted" in line for line in out.splitlines()), out[-3000:]
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["duplicates"].split()[-1] == "0" and lines["losses"].split()[-1] == "0"
