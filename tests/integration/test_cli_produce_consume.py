"""`oncelog produce` and `oncelog consume` end to end, with confluent-kafka (librdkafka) on the other side of
each, so what the CLI wrote and read is checked by an independent client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer as CKConsumer
from tests.integration.client.admin_support import cli_error, cli_json, run_cli
from tests.integration.helpers import Out, ck_consume, ck_produce, ck_producer, wait_until


@pytest.fixture(scope="module")
def bootstrap(module_broker):
    return module_broker.bootstrap


def consume_json(bootstrap: str, *args: str) -> list[dict]:
    proc = run_cli(bootstrap, "consume", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_produce_lines_with_keys(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "3")
    summary = cli_json(bootstrap, "produce", topic_name, "--key-separator", ":", "--partition", "2",
                       input="k1:v1\nk2:v:2\n:empty-key\nk4:\n")
    assert summary == {"topic": topic_name, "records": 4, "transactional_id": None,
                       "partitions": {"2": {"records": 4, "first_offset": 0, "last_offset": 3}}}
    got = ck_consume(bootstrap, topic_name, {2: 0})
    assert [(r.offset, r.key, r.value) for r in got] == [
        (0, b"k1", b"v1"), (1, b"k2", b"v:2"), (2, b"", b"empty-key"), (3, b"k4", b"")]


def test_produce_keyless_lines_bytes_as_they_are(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name)
    payload = "plain\r\n  spaced  \n\ncaf\u00e9\nlast-without-newline"
    summary = cli_json(bootstrap, "produce", topic_name, input=payload)
    assert summary["records"] == 5 and summary["partitions"] == {"0": {"records": 5, "first_offset": 0,
                                                                        "last_offset": 4}}
    got = ck_consume(bootstrap, topic_name, {0: 0})
    assert [(r.key, r.value) for r in got] == [
        (None, b"plain"), (None, b"  spaced  "), (None, b""), (None, "caf\u00e9".encode()),
        (None, b"last-without-newline")]
    proc = run_cli(bootstrap, "produce", topic_name, input="one\ntwo\n")
    assert (proc.returncode, proc.stdout) == (0, f"Produced 2 records to {topic_name}: partition 0 offsets 5-6.\n")


def test_produce_transactional(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    txn_id = topic_name + "-txn"
    summary = cli_json(bootstrap, "produce", topic_name, "--transactional", "--transactional-id", txn_id,
                       "-p", "1", input="a\nb\nc\n")
    assert summary == {"topic": topic_name, "records": 3, "transactional_id": txn_id,
                       "partitions": {"1": {"records": 3, "first_offset": 0, "last_offset": 2}}}
    assert cli_json(bootstrap, "transactions", "describe", txn_id)["state"] == "CompleteCommit"
    committed = ck_consume(bootstrap, topic_name, {1: 0}, **{"isolation.level": "read_committed"})
    assert [(r.offset, r.value) for r in committed] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert cli_json(bootstrap, "records", "offsets", topic_name, "-p", "1", "--isolation", "read_committed") == [
        {"topic": topic_name, "partition": 1, "offset": 4, "timestamp": -1}]  # after the commit marker


def test_failed_transactional_produce_leaves_nothing_visible(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name)
    txn_id = topic_name + "-txn"
    line = cli_error(bootstrap, "produce", topic_name, "--transactional", "--transactional-id", txn_id,
                     "-K", "=", input="k=v\n" * 3000 + "broken\nk=4\n")
    assert line == "oncelog: error: line 3001 has no key separator '='"
    # aborted, or never started if nothing had been sent yet
    assert cli_json(bootstrap, "transactions", "describe", txn_id)["state"] in ("CompleteAbort", "Empty")
    assert ck_consume(bootstrap, topic_name, {0: 0}, **{"isolation.level": "read_committed"}) == []
    offsets = cli_json(bootstrap, "records", "offsets", topic_name, "--isolation", "read_committed")
    latest = cli_json(bootstrap, "records", "offsets", topic_name)
    assert offsets == latest  # aborted, not hanging: the LSO is the end of the log


def test_consume_from_beginning_until_end(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    ts = 1_700_000_000_000
    ck_produce(bootstrap, topic_name, [
        Out(0, b"k0", b"v0", (("h", b"x"), ("n", None)), ts), Out(0, None, b"v1", (), ts + 1),
        Out(1, b"k2", bytes([0xFF, 0x00]), (), ts + 2)])
    assert consume_json(bootstrap, topic_name, "--from-beginning", "--until-end") == [
        {"topic": topic_name, "partition": 0, "offset": 0, "timestamp": ts, "key": "k0", "value": "v0",
         "headers": [["h", "x"], ["n", None]]},
        {"topic": topic_name, "partition": 0, "offset": 1, "timestamp": ts + 1, "key": None, "value": "v1",
         "headers": []},
        {"topic": topic_name, "partition": 1, "offset": 0, "timestamp": ts + 2, "key": "k2", "value": "base64:/wA=",
         "headers": []},
    ]
    proc = run_cli(bootstrap, "consume", topic_name, "-p", "0", "-o", "0", "-e", "--print-key", "--key-separator", "|")
    assert (proc.returncode, proc.stdout) == (0, "k0|v0\n|v1\n")
    # from the end (the default) there is nothing to read
    assert consume_json(bootstrap, topic_name, "--until-end") == []


def test_consume_partition_offset_and_max(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    ck_produce(bootstrap, topic_name, [Out(1, None, b"m%d" % i) for i in range(10)])
    got = consume_json(bootstrap, topic_name, "--partition", "1", "--offset", "4", "--max", "3")
    assert [(r["partition"], r["offset"], r["value"]) for r in got] == [(1, 4, "m4"), (1, 5, "m5"), (1, 6, "m6")]
    proc = run_cli(bootstrap, "consume", topic_name, "-p", "1", "-o", "earliest", "-n", "2")
    assert (proc.returncode, proc.stdout) == (0, "m0\nm1\n")
    assert consume_json(bootstrap, topic_name, "-p", "0", "--from-beginning", "--idle-timeout", "0.5") == []
    assert cli_error(bootstrap, "consume", topic_name, "--offset", "3") == "oncelog: error: --offset needs --partition"
    assert cli_error(bootstrap, "consume", topic_name, "-p", "7") == (
        f"oncelog: error: topic {topic_name} has no partition 7")
    assert cli_error(bootstrap, "consume", topic_name + "-missing", "-e").startswith(
        "oncelog: error: UNKNOWN_TOPIC_OR_PARTITION (3): ")


def test_consume_isolation_levels(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name)
    ck_produce(bootstrap, topic_name, [Out(0, None, b"before")])
    producer = ck_producer(bootstrap, **{"transactional.id": topic_name, "enable.idempotence": True})
    producer.init_transactions(20)
    producer.begin_transaction()
    producer.produce(topic_name, b"pending", partition=0)
    assert producer.flush(20) == 0
    ck_produce(bootstrap, topic_name, [Out(0, None, b"after")])

    def values(*args: str) -> list[str]:
        return [r["value"] for r in consume_json(bootstrap, topic_name, "--from-beginning", "-e", *args)]

    assert values() == ["before"]  # read_committed (the default) stops at the open transaction
    assert values("--isolation", "read_uncommitted") == ["before", "pending", "after"]
    producer.abort_transaction(20)
    assert values() == ["before", "after"]
    assert values("--isolation", "read_uncommitted") == ["before", "pending", "after"]


def test_consume_in_a_group_commits_what_it_printed(bootstrap, topic_name):
    group = topic_name + "-g"
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    ck_produce(bootstrap, topic_name, [Out(p, None, b"%d-%d" % (p, i)) for p in (0, 1) for i in range(3)])
    first = consume_json(bootstrap, topic_name, "--group", group, "--from-beginning", "--max", "4")
    second = consume_json(bootstrap, topic_name, "--group", group, "-e")
    both = sorted((r["partition"], r["offset"]) for r in first + second)
    assert len(first) == 4 and both == [(p, o) for p in (0, 1) for o in range(3)]  # nothing twice, nothing lost
    offsets = cli_json(bootstrap, "groups", "describe", group)["offsets"]
    assert [(o["partition"], o["current_offset"], o["lag"]) for o in offsets] == [(0, 3, 0), (1, 3, 0)]
    assert cli_error(bootstrap, "consume", topic_name, "--group", group, "-p", "0") == (
        "oncelog: error: --partition cannot be used with --group")


def test_progress_bars(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name)
    lines = "".join(f"line-{i}\n" for i in range(2000))
    proc = run_cli(bootstrap, "produce", topic_name, "--progress", input=lines)
    assert proc.returncode == 0, proc.stderr
    assert "records" in proc.stderr and f"producing to {topic_name}" in proc.stderr  # a pipe: no total known
    proc = run_cli(bootstrap, "consume", topic_name, "--from-beginning", "--max", "2000", "--progress")
    assert proc.returncode == 0, proc.stderr
    assert "100.0% 2000/2000 records" in proc.stderr
    assert proc.stdout.splitlines() == [f"line-{i}" for i in range(2000)]


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Background:
    """`python -m oncelog ARGS --bootstrap-server B` running in the background; stdout and stderr are collected
    as they come (progress bars end no line), stdin is a pipe the test writes to."""

    def __init__(self, bootstrap: str, *args: str) -> None:
        env = dict(os.environ)
        env.pop("ONCELOG_BOOTSTRAP", None)
        # As from a terminal: SIGINT is not ignored. A runner that starts the tests in the background without job
        # control (CI) hands its children SIGINT ignored, and the CLI rightly keeps an inherited ignore (nohup).
        self.proc = subprocess.Popen([sys.executable, "-m", "oncelog", *args, "--bootstrap-server", bootstrap],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     preexec_fn=_sigint_default)
        self.out, self.err = bytearray(), bytearray()
        self._readers = [threading.Thread(target=self._collect, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _collect(stream, into: bytearray) -> None:
        while chunk := stream.read1(65536):
            into.extend(chunk)

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait_for(self, predicate, what: str) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {bytes(self.err).decode()}"
            return predicate()

        wait_until(ready, timeout=30, what=what)

    def stop(self, sig: signal.Signals, timeout: float = 10) -> int:
        """Send `sig`; the exit status (the process must end within `timeout` seconds)."""
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        finally:
            self.close()
        for reader in self._readers:
            reader.join(5)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


def group_state(bootstrap: str, group: str) -> tuple[str, list, dict[int, int]]:
    described = cli_json(bootstrap, "groups", "describe", group)
    return (described["state"], described["members"],
            {o["partition"]: o["current_offset"] for o in described["offsets"]})


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_consume_in_a_group_stopped_by_a_signal_commits_and_leaves(bootstrap, topic_name, sig):
    """SIGTERM stops `consume --group` as Ctrl-C does: what it printed is committed, LeaveGroup is sent (the group
    is Empty at once, although the member's session timeout is a minute), exit status 0; the next member is
    assigned the partitions and starts where the stopped one ended."""
    group = topic_name + "-g"
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    ck_produce(bootstrap, topic_name, [Out(p, None, b"%d-%d" % (p, i)) for p in (0, 1) for i in range(5)])
    cli = Background(bootstrap, "consume", topic_name, "--group", group, "--from-beginning",
                     "-X", "session.timeout.ms=60000", "-X", "heartbeat.interval.ms=1000")
    try:
        cli.wait_for(lambda: cli.out.count(b"\n") == 10, "the CLI consumer printing the 10 records")
        state, members, _ = group_state(bootstrap, group)
        assert (state, len(members)) == ("Stable", 1)
        code = cli.stop(sig)
    finally:
        cli.close()
    assert (code, bytes(cli.err)) == (0, b"")
    assert sorted(bytes(cli.out).splitlines()) == sorted(b"%d-%d" % (p, i) for p in (0, 1) for i in range(5))
    assert group_state(bootstrap, group) == ("Empty", [], {0: 5, 1: 5})

    ck_produce(bootstrap, topic_name, [Out(p, None, b"new-%d" % p) for p in (0, 1)])
    successor = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                            "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    try:
        successor.subscribe([topic_name])
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 30  # the old member, had it not left, would hold the group for 60 s
        while len(got) < 2 and time.monotonic() < deadline:
            msg = successor.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append((msg.partition(), msg.offset(), msg.value()))
        assert sorted(got) == [(0, 5, b"new-0"), (1, 5, b"new-1")]
        assert sorted(tp.partition for tp in successor.assignment()) == [0, 1]
    finally:
        successor.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_produce_stopped_by_a_signal_delivers_what_it_accepted(bootstrap, topic_name, sig):
    """Lines the CLI producer has taken (linger.ms holds them in its buffer) are delivered when SIGTERM stops it,
    as on Ctrl-C: exit status 130 and 'interrupted'."""
    cli_json(bootstrap, "topics", "create", topic_name)
    cli = Background(bootstrap, "produce", topic_name, "--progress", "-X", "linger.ms=600000")
    try:
        for i in range(3):
            cli.write(b"line-%d\n" % i)
            # the bar shows a count after produce() took the record; it redraws at most every 0.1 s
            cli.wait_for(lambda n=i + 1: f"producing to {topic_name} {n} records".encode() in cli.err,
                         f"the CLI producer taking line {i}")
            time.sleep(0.11)
        assert ck_consume(bootstrap, topic_name, {0: 0}) == []  # still in the producer's buffer
        code = cli.stop(sig)
    finally:
        cli.close()
    assert code == 130 and bytes(cli.err).endswith(b"oncelog: interrupted\n"), (code, bytes(cli.err))
    assert [(r.offset, r.value) for r in ck_consume(bootstrap, topic_name, {0: 0})] == [
        (0, b"line-0"), (1, b"line-1"), (2, b"line-2")]


def txn_state(bootstrap: str, txn_id: str) -> str | None:
    """The coordinator's state of a transactional id (None until the producer registered it)."""
    proc = run_cli(bootstrap, "transactions", "describe", txn_id, "--json")
    return json.loads(proc.stdout)["state"] if proc.returncode == 0 else None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_transactional_produce_stopped_by_a_signal_aborts(bootstrap, topic_name, sig):
    """SIGTERM aborts the open transaction as Ctrl-C does, rather than leaving it to pin the last stable offset
    until transaction.timeout.ms."""
    cli_json(bootstrap, "topics", "create", topic_name)
    txn_id = topic_name + "-txn"
    cli = Background(bootstrap, "produce", topic_name, "--transactional", "--transactional-id", txn_id)
    try:
        cli.write(b"a\nb\n")
        cli.wait_for(lambda: txn_state(bootstrap, txn_id) == "Ongoing", "the CLI producer's transaction to start")
        wait_until(lambda: cli_json(bootstrap, "records", "offsets", topic_name)[0]["offset"] == 2,
                   what="the two records written")
        code = cli.stop(sig)
    finally:
        cli.close()
    assert code == 130 and bytes(cli.err).endswith(b"oncelog: interrupted\n"), (code, bytes(cli.err))
    # EndTxn(ABORT), then the client's epoch bump (KIP-360) may already have moved it on to Empty
    assert txn_state(bootstrap, txn_id) in ("CompleteAbort", "Empty")
    assert cli_json(bootstrap, "records", "offsets", topic_name, "--isolation", "read_committed") == \
        cli_json(bootstrap, "records", "offsets", topic_name)  # nothing open: the LSO is the end of the log
    assert ck_consume(bootstrap, topic_name, {0: 0}, **{"isolation.level": "read_committed"}) == []
