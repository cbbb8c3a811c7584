"""The PySpark exactly-once pipeline (`make demo`, shortened) on a three-broker oncelog cluster: the sink's
transactions span partitions led by every broker, the source reads from every leader, the repartition topic is
purged with DeleteRecords cluster-wide; the verdict must be exactly once."""

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


def test_the_demo_pipeline_is_exactly_once_on_a_cluster(cluster):
    require_spark()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-m", "oncelog.spark.demo", "--bootstrap", cluster.bootstrap,
                           "--seconds", "6", "--rate", "1000"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert "EXACTLY ONCE: yes" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["duplicates"].split()[-1] == "0" and lines["losses"].split()[-1] == "0"
