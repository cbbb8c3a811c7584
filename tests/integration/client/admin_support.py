"""Helpers shared by the admin client and CLI tests: the `oncelog` command as a subprocess, and a
hanging transaction made the way one happens in production.

A hanging transaction needs a partition whose producer state shows an open transaction that
no coordinator will ever finish. oncelog's coordinator verifies every transactional write
(KIP-890 part 1), so a zombie cannot start one; what is left is losing the coordinator's
state: a confluent-kafka transactional producer writes and is killed (SIGKILL, no abort),
then the broker restarts without its `__transaction_state` topic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from oncelog.embedded import BrokerProcess

_PRODUCER = r"""
import sys
from confluent_kafka import Producer
bootstrap, topic, partition, txn_id = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 900000,
              "linger.ms": 0})
p.init_transactions(30)
p.begin_transaction()
for value in sys.argv[5:]:
    p.produce(topic, value.encode(), partition=partition)
assert p.flush(30) == 0
print("open", flush=True)
sys.stdin.read()
"""


def open_transaction_then_kill(bootstrap: str, topic: str, partition: int, txn_id: str, values: list[str]) -> None:
    """A transactional producer process writes `values` inside a transaction and dies without ending it."""
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, bootstrap, topic, str(partition), txn_id, *values],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip() == "open", f"producer failed: {line!r} {proc.stderr.read() if proc.stderr else ''}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def lose_transaction_state(broker: BrokerProcess) -> None:
    """Restart the broker without its transaction coordinator's state (the `__transaction_state` topic)."""
    broker.stop()
    meta = Path(broker.data_dir) / "__oncelog_meta" / "topics" / "__transaction_state.json"
    assert meta.exists(), "the transaction log was never created"
    meta.unlink()
    broker.start()


def run_cli(bootstrap: str | None, *args: str, input: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`python -m oncelog ARGS --bootstrap-server B` (no --bootstrap-server when `bootstrap` is None)."""
    full_env = dict(os.environ)
    full_env.pop("ONCELOG_BOOTSTRAP", None)  # only what the test says
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "oncelog", *args]
    if bootstrap is not None:
        cmd += ["--bootstrap-server", bootstrap]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=full_env)


def cli_json(bootstrap: str, *args: str, input: str | None = None) -> Any:
    """Run a command with --json; it must succeed with nothing on stderr."""
    proc = run_cli(bootstrap, *args, "--json", input=input)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    assert proc.stderr == "", proc.stderr
    return json.loads(proc.stdout)


def cli_error(bootstrap: str | None, *args: str, input: str | None = None) -> str:
    """Run a command that must fail: exit status 1, one line on stderr, no traceback; returns the line."""
    proc = run_cli(bootstrap, *args, input=input)
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stdout} {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.stdout == "", proc.stdout
    return lines[0]
