"""`oncelog cluster start` (what `make cluster` runs): ZooKeeper and brokers in the foreground, one ready line with
the bootstrap list, SIGTERM stops everything with exit 0, and the next start finds the same cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from kafka.admin import KafkaAdminClient, NewTopic

from tests.cluster.cluster_processes import START_S


def start(data_dir) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "oncelog", "cluster", "start", "--data-dir", str(data_dir),
                             "--brokers", "2", "--port", "0", "--coordination-port", "0",
                             "--set", "oncelog.coordination.session.timeout.ms=6000",
                             "--set", "offsets.topic.replication.factor=2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = proc.stdout.readline()
    assert line.startswith("oncelog cluster ready: bootstrap "), (line, proc.stderr.read() if not line else "")
    return proc, line.split("bootstrap ", 1)[1].strip()


def stop(proc: subprocess.Popen) -> int:
    os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(START_S)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cluster_start_runs_brokers_until_sigterm_and_keeps_the_cluster(tmp_path):
    proc, bootstrap = start(tmp_path / "cluster")
    try:
        assert len(bootstrap.split(",")) == 2
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        assert sorted(b["broker_id"] for b in admin.describe_cluster()["brokers"]) == [1, 2]
        admin.create_topics([NewTopic("kept", 2, 2)])
        admin.close()
    finally:
        assert stop(proc) == 0
    for node in (1, 2):
        assert "broker stopped cleanly" in (tmp_path / "cluster" / f"broker-{node}-broker.log").read_text()
    # The data stays: the next start is the same cluster, with its topic.
    proc, bootstrap = start(tmp_path / "cluster")
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        deadline = time.monotonic() + 30
        while "kept" not in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "kept" in admin.list_topics()
        admin.close()
    finally:
        assert stop(proc) == 0
