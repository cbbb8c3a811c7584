"""Helpers for tests of the development cluster (`oncelog cluster start`, `make cluster`) as a user runs it: its
stdout and stderr read line by line on threads, its processes found in /proc, a record through a real client."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

WAIT_S = 240.0      # a cluster's start, a restart after a backoff: generous on two loaded cores


class Lines:
    """A stream's lines, read on a thread into a queue; `expect` waits for one matching a pattern."""

    def __init__(self, stream) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def expect(self, pattern: str, timeout: float = WAIT_S) -> re.Match:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} in {timeout:.0f} s; seen: {self.seen}") from None
            if line is None:
                raise AssertionError(f"stream ended before a line matching {pattern!r}; seen: {self.seen}")
            self.seen.append(line)
            if match := regex.search(line):
                return match

    def rest(self, timeout: float = 30.0) -> list[str]:
        """Every line until the stream ends."""
        deadline = time.monotonic() + timeout
        while (line := self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))) is not None:
            self.seen.append(line)
        return self.seen


def processes_under(directory: Path) -> dict[int, list[str]]:
    """{pid: argv} of every live process whose arguments name a path under `directory` (a broker's --data-dir,
    ZooKeeper's zoo.cfg): what a cluster run there left running."""
    mark = str(directory)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(mark in a for a in argv):
            found[int(entry.name)] = argv
    return found


def broker_pids(directory: Path) -> dict[int, int]:
    """{node id: pid} of the `oncelog serve` processes with a data directory directory/broker-<id>."""
    out = {}
    for pid, argv in processes_under(directory).items():
        if "serve" in argv and "--data-dir" in argv:
            name = Path(argv[argv.index("--data-dir") + 1]).name
            if name.startswith("broker-") and Path(argv[argv.index("--data-dir") + 1]).parent == directory:
                out[int(name.split("-", 1)[1])] = pid
    return out


def zookeeper_pid(directory: Path) -> int:
    (pid,) = [pid for pid, argv in processes_under(directory).items()
              if any(a.endswith("zoo.cfg") for a in argv)]
    return pid


def wait_gone(directory: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := processes_under(directory)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left running: {left}"


def create_topic(bootstrap: str, topic: str, replication: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(topic, 1, replication)])
    finally:
        admin.close()


def round_trip(bootstrap: str, topic: str | None = None, replication: int = 1, timeout: float = 120.0) -> None:
    """Produce one record with acks=all and consume it back, with kafka-python; to a new topic (of `replication`)
    unless `topic` names one."""
    if topic is None:
        topic = f"t-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, replication)
    value = uuid.uuid4().hex.encode()
    # Retried until `timeout`, not a count of retries: after a leader's SIGKILL the others answer
    # NOT_LEADER_OR_FOLLOWER until the controller has declared it dead and elected, which on a loaded machine
    # outlasted 20 retries of 100 ms once.
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retry_backoff_ms=250,
                             request_timeout_ms=30000, delivery_timeout_ms=int(timeout * 1000))
    try:
        producer.send(topic, value).get(timeout=timeout)
    finally:
        producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(timeout * 1000))
    try:
        for record in consumer:
            if record.value == value:
                return
        raise AssertionError(f"the record produced to {topic} was not consumed in {timeout:.0f} s")
    finally:
        consumer.close()


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def log_time(log: Path, pattern: str) -> datetime | None:
    """The timestamp of the last line of a broker log matching `pattern`."""
    found = None
    for line in log.read_text(errors="replace").splitlines():
        if re.search(pattern, line) and (m := _STAMP.match(line)):
            found = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return found


def kill_quietly(proc: subprocess.Popen, directory: Path | None = None) -> None:
    """SIGKILL the command if it still runs, and whatever it started under `directory` (a failed test must not
    leave brokers behind: a command that is killed takes them along only when it did set that up)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in processes_under(directory) if directory is not None else ():
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def signal_group(pid: int, sig: int) -> None:
    """Ctrl-C at a terminal: the signal to the whole foreground process group (the command leads its own)."""
    os.killpg(os.getpgid(pid), sig)
