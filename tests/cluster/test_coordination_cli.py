"""`oncelog coordination start`: the ready line, a usable ZooKeeper behind it, clean stops, and its errors."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

START_TIMEOUT_S = 60.0                   # the command's --start-timeout
WAIT_S = START_TIMEOUT_S + 60.0          # + Python's start and the JVM's stop bound, at most
READY = re.compile(r"^oncelog coordination ready at (127\.0\.0\.1:(\d+))$")


def _sigint_default() -> None:
    # As from a terminal: a runner without job control hands children SIGINT ignored, which the CLI keeps.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Command:
    """`python -m oncelog coordination start ...` in the background, its stdout lines in a queue."""

    def __init__(self, data_dir: Path, listen: str = "127.0.0.1:0", env: dict[str, str] | None = None,
                 cwd: Path | None = None, sigint: signal.Handlers = signal.SIG_DFL) -> None:
        def inherited() -> None:
            signal.signal(signal.SIGINT, sigint)

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oncelog", "coordination", "start", "--data-dir", str(data_dir),
             "--listen", listen, "--start-timeout", str(START_TIMEOUT_S)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
            preexec_fn=_sigint_default if sigint == signal.SIG_DFL else inherited)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def ready_url(self) -> str:
        try:
            line = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"no ready line within {WAIT_S:.0f} s")
        if line is None:
            self.proc.wait(WAIT_S)
            pytest.fail(f"exited {self.proc.returncode} before the ready line: {self.proc.stderr.read()}")
        match = READY.match(line)
        assert match, f"unexpected first line {line!r}"
        return match.group(1)

    def jvm_pid(self) -> int:
        """The command's one child process: the ZooKeeper JVM."""
        children = _children(self.proc.pid)
        assert len(children) == 1, f"children of {self.proc.pid}: {children}"
        return children[0]

    def finish(self) -> tuple[int, list[str], str]:
        """Exit code, the stdout lines after the ready line, stderr."""
        code = self.proc.wait(WAIT_S)
        rest = []
        while (line := self.lines.get(timeout=WAIT_S)) is not None:
            rest.append(line)
        return code, rest, self.proc.stderr.read()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie not yet reaped by init counts as gone
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def command(zookeeper_runtime):
    started: list[Command] = []

    def make(*args, **kwargs) -> Command:
        started.append(Command(*args, **kwargs))
        return started[-1]

    yield make
    for cmd in started:
        cmd.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_ready_line_serves_znodes_and_a_signal_stops_the_jvm(command, kazoo_client, tmp_path, sig):
    cmd = command(tmp_path / "zk")
    url = cmd.ready_url()
    jvm = cmd.jvm_pid()
    client = kazoo_client(url)
    client.create("/oncelog-cli-test", b"value-1")
    assert client.get("/oncelog-cli-test")[0] == b"value-1"
    client.stop()
    cmd.proc.send_signal(sig)
    code, rest, err = cmd.finish()
    assert code == 0, err
    assert rest == [], "the ready line is the only line on stdout"
    assert _gone(jvm), f"ZooKeeper JVM {jvm} outlived the command"
    assert {p.name for p in (tmp_path / "zk").iterdir()} >= {"zoo.cfg", "zookeeper.log", "version-2"}


def test_a_relative_data_dir_is_the_working_directorys(command, kazoo_client, tmp_path):
    """The JVM runs in its data directory: a relative --data-dir handed on as given named nothing there
    ("zoo.cfg file is missing", exit code 2)."""
    cmd = command(Path("zk"), cwd=tmp_path)
    kazoo_client(cmd.ready_url()).create("/relative", b"here")
    cmd.proc.send_signal(signal.SIGTERM)
    code, rest, err = cmd.finish()
    assert code == 0, err
    assert {p.name for p in (tmp_path / "zk").iterdir()} >= {"zoo.cfg", "zookeeper.log", "version-2"}


def test_sigint_stops_it_when_started_with_sigint_ignored(command, tmp_path):
    """`oncelog coordination start &` from a script inherits SIGINT ignored; `kill -INT` still stops it, as it
    stops `oncelog serve`."""
    cmd = command(tmp_path / "zk", sigint=signal.SIG_IGN)
    cmd.ready_url()
    jvm = cmd.jvm_pid()
    cmd.proc.send_signal(signal.SIGINT)
    try:
        code, rest, err = cmd.finish()
    except subprocess.TimeoutExpired:
        pytest.fail("SIGINT ignored: still running")
    assert code == 0, err
    assert _gone(jvm)


def test_data_dir_keeps_znodes_across_commands(command, kazoo_client, tmp_path):
    first = command(tmp_path / "zk")
    client = kazoo_client(first.ready_url())
    client.create("/kept", b"across restarts")
    client.stop()
    first.proc.send_signal(signal.SIGTERM)
    assert first.finish()[0] == 0
    second = command(tmp_path / "zk")
    assert kazoo_client(second.ready_url()).get("/kept")[0] == b"across restarts"


def test_jvm_death_is_an_error_with_the_log_tail(command, tmp_path):
    cmd = command(tmp_path / "zk")
    cmd.ready_url()
    os.kill(cmd.jvm_pid(), signal.SIGKILL)
    code, rest, err = cmd.finish()
    assert code == 1
    assert "exited on its own" in err and "zookeeper.log" in err, err
    assert "Traceback" not in err


def test_port_taken_is_a_one_line_error(command, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, rest, err = command(tmp_path / "zk", f"127.0.0.1:{port}").finish()
    assert code == 1
    assert err.strip() == f"oncelog: error: 127.0.0.1:{port} is already in use by another process"
    assert rest == []


def test_missing_java_or_mvn_is_a_one_line_error(tmp_path):
    """Needs no Java: PATH without java, then with java but no mvn and nothing cached."""
    def run(path: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": path, "ONCELOG_ZOOKEEPER_CACHE": str(tmp_path / "empty-cache")}
        return subprocess.run([sys.executable, "-m", "oncelog", "coordination", "start", "--data-dir",
                               str(tmp_path / "zk"), "--listen", "127.0.0.1:0"],
                              capture_output=True, text=True, env=env, timeout=WAIT_S)

    empty = tmp_path / "bin-empty"
    empty.mkdir()
    proc = run(str(empty))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("oncelog: error: no `java` on PATH") and proc.stderr.count("\n") == 1

    java = shutil.which("java")
    if java is None:
        pytest.skip("no java here to show the missing-mvn error")
    only_java = tmp_path / "bin-java"
    only_java.mkdir()
    (only_java / "java").symlink_to(java)
    proc = run(str(only_java))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("oncelog: error: no `mvn` on PATH") and proc.stderr.count("\n") == 1


def test_classpath_prints_zookeeper_jars(zookeeper_runtime):
    proc = subprocess.run([sys.executable, "-m", "oncelog", "coordination", "classpath"], capture_output=True,
                          text=True, timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr
    jars = proc.stdout.strip().split(os.pathsep)
    assert proc.stdout.strip() == zookeeper_runtime[1]
    assert any(Path(jar).name.startswith("zookeeper-3.") for jar in jars)
    assert all(Path(jar).is_file() for jar in jars)


def test_ready_only_once_serving(command, tmp_path):
    """The ready line comes after ZooKeeper answers: a session opens at once, with no retry."""
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    url = command(tmp_path / "zk").ready_url()
    client = KazooClient(hosts=url, connection_retry=KazooRetry(max_tries=0))
    t0 = time.monotonic()
    try:
        client.start(timeout=10)
        assert client.exists("/") is not None
    finally:
        client.stop()
        client.close()
    assert time.monotonic() - t0 < 10


def test_the_jvm_dies_with_a_killed_command(command, tmp_path):
    """SIGKILL leaves the command no time to stop anything: the JVM goes with it (parent-death signal)."""
    cmd = command(tmp_path / "zk")
    cmd.ready_url()
    jvm = cmd.jvm_pid()
    cmd.proc.kill()
    cmd.proc.wait(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    try:
        while not _gone(jvm):
            assert time.monotonic() < deadline, f"ZooKeeper JVM {jvm} outlived its killed command"
            time.sleep(0.1)
    finally:
        if not _gone(jvm):
            os.kill(jvm, signal.SIGKILL)


def test_a_relative_jar_cache_is_the_working_directorys(zookeeper_runtime, tmp_path):
    """ONCELOG_ZOOKEEPER_CACHE=relative: Maven takes its output file relative to the pom's directory, so the
    classpath was written inside the package and read from here (FileNotFoundError, a traceback)."""
    if shutil.which("mvn") is None:
        pytest.skip("no mvn to resolve into a fresh cache")
    env = {**os.environ, "ONCELOG_ZOOKEEPER_CACHE": "jar-cache"}
    proc = subprocess.run([sys.executable, "-m", "oncelog", "coordination", "classpath"], capture_output=True,
                          text=True, timeout=WAIT_S * 3, env=env, cwd=tmp_path)
    if proc.returncode != 0 and "not reachable" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == zookeeper_runtime[1]
    assert [p.name for p in (tmp_path / "jar-cache").iterdir() if p.name.startswith("classpath-")]
