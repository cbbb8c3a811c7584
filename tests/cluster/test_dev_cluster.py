"""`oncelog cluster start` as a developer uses it: a relative --data-dir, a background job's ignored SIGINT, a
broker or ZooKeeper that dies and is restarted by the command (a failover to watch), and a Ctrl-C that stops the
brokers one at a time with the controller last."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from oncelog.embedded import broker_metadata
from tests.cluster.dev_cluster import (
    WAIT_S,
    Lines,
    broker_pids,
    create_topic,
    kill_quietly,
    log_time,
    round_trip,
    signal_group,
    wait_gone,
    zookeeper_pid,
)

READY = r"^oncelog cluster ready: bootstrap (\S+)$"


def start(cwd: Path, data_dir: str, *extra: str,
          sigint: signal.Handlers = signal.SIG_DFL) -> tuple[subprocess.Popen, Lines, str]:
    """The command run in `cwd`, in a session of its own (a signal to its group is a terminal's Ctrl-C), with
    SIGINT inherited as `sigint`; returns it, its stderr lines and the bootstrap list of its ready line."""
    proc = subprocess.Popen([sys.executable, "-m", "oncelog", "cluster", "start", "--data-dir", data_dir,
                             "--port", "0", "--coordination-port", "0",
                             "--set", "oncelog.coordination.session.timeout.ms=6000", *extra],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        bootstrap = out.expect(READY).group(1)
    except AssertionError as exc:
        kill_quietly(proc, cwd)
        raise AssertionError(f"{exc}; stderr: {err.rest()}") from None
    return proc, err, bootstrap


def finish(proc: subprocess.Popen, err: Lines) -> int:
    try:
        return proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        kill_quietly(proc)
        raise AssertionError(f"still running {WAIT_S:.0f} s after the signal; stderr: {err.seen}") from None


def test_a_relative_data_dir_is_the_working_directorys(tmp_path, zookeeper_runtime):
    """make cluster's default is ./data/cluster: ZooKeeper runs in a directory of its own, so a relative path
    handed to it as given named nothing (zoo.cfg "missing") and the cluster never started."""
    work = tmp_path / "work"
    work.mkdir()
    proc, err, bootstrap = start(work, "data/cluster", "--brokers", "1")
    try:
        round_trip(bootstrap)
        os.kill(proc.pid, signal.SIGTERM)
        assert finish(proc, err) == 0, err.rest()
    finally:
        kill_quietly(proc, work)
    cluster = work / "data" / "cluster"
    assert (cluster / "coordination" / "zoo.cfg").is_file() and (cluster / "broker-1").is_dir()
    assert "broker stopped cleanly" in (cluster / "broker-1-broker.log").read_text()
    wait_gone(cluster)


def test_sigint_stops_it_when_started_with_sigint_ignored(tmp_path, zookeeper_runtime):
    """`oncelog cluster start &` from a script inherits SIGINT ignored; `kill -INT` must still stop it cleanly,
    as it stops `oncelog serve`."""
    proc, err, bootstrap = start(tmp_path, str(tmp_path / "c"), "--brokers", "1", sigint=signal.SIG_IGN)
    try:
        os.kill(proc.pid, signal.SIGINT)
        assert finish(proc, err) == 0, err.rest()
    finally:
        kill_quietly(proc, tmp_path)
    wait_gone(tmp_path / "c")


def test_a_dead_broker_or_zookeeper_is_restarted_and_ctrl_c_stops_brokers_one_at_a_time(tmp_path,
                                                                                         zookeeper_runtime):
    """The failover the README shows: SIGKILL the leader of a partition; one line says so, the others serve it
    meanwhile, the broker is started again after the backoff's first second and registers again. ZooKeeper
    likewise. Then Ctrl-C (to the command's process group, as a terminal sends it): the brokers stop one at a
    time, each after the previous one is gone, the active controller last, with no controlled-shutdown retry."""
    directory = tmp_path / "c"
    proc, err, bootstrap = start(tmp_path, str(directory), "--brokers", "3")
    ports = {n: int(b.rsplit(":", 1)[1]) for n, b in enumerate(bootstrap.split(","), 1)}
    try:
        create_topic(bootstrap, "failover", 3)
        round_trip(bootstrap, "failover")
        (partition,) = broker_metadata(ports[1], ["failover"]).topics[0].partitions
        victim = partition.leader_id
        pid = broker_pids(directory)[victim]
        log = directory / f"broker-{victim}-broker.log"
        os.kill(pid, signal.SIGKILL)
        err.expect(rf"^oncelog cluster: broker {victim} \(pid {pid}\) died \(killed by SIGKILL\); "
                   rf"log {re.escape(str(log))}; restarting it in 1 s$")
        others = ",".join(f"127.0.0.1:{p}" for n, p in ports.items() if n != victim)
        round_trip(others, "failover")                       # the partition's new leader serves it
        back = err.expect(rf"^oncelog cluster: broker {victim} is back \(pid (\d+)\) after [\d.]+ s$")
        assert int(back.group(1)) == broker_pids(directory)[victim] != pid
        assert victim in {b.node_id for b in broker_metadata(ports[victim], []).brokers}

        zk = zookeeper_pid(directory)
        os.kill(zk, signal.SIGKILL)
        err.expect(rf"^oncelog cluster: ZooKeeper \(pid {zk}\) died \(killed by SIGKILL\); "
                   rf"log {re.escape(str(directory / 'coordination' / 'zookeeper.log'))}; restarting it in 1 s$")
        err.expect(r"^oncelog cluster: ZooKeeper is back \(pid \d+\)")
        round_trip(bootstrap, replication=3)                 # creating a topic needs ZooKeeper

        controller = broker_metadata(ports[1], []).controller_id
        signal_group(proc.pid, signal.SIGINT)
        assert finish(proc, err) == 0, err.rest()
    finally:
        kill_quietly(proc, directory)
    order = [int(n) for n in err.expect(r"stopping brokers ([\d, ]+) one at a time", 1).group(1).split(", ")]
    assert sorted(order) == [1, 2, 3] and order[-1] == controller
    logs = {n: directory / f"broker-{n}-broker.log" for n in order}
    for earlier, later in zip(order, order[1:], strict=False):
        stopped = log_time(logs[earlier], "broker stopped cleanly")
        moved = log_time(logs[later], r"oncelog\.cluster: controlled shutdown")
        assert stopped is not None and moved is not None and stopped <= moved, (earlier, stopped, later, moved)
    for n, path in logs.items():
        assert "controlled shutdown attempt" not in path.read_text(), f"broker {n} retried its controlled shutdown"
    wait_gone(directory)
