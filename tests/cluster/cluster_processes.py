"""Helpers for end-to-end cluster tests: broker processes on the module's ZooKeeper, raw requests, waits.

Every wait is bounded by a multiple of the ZooKeeper session timeout the brokers run with (a death is noticed
when the session expires), never by a sleep tuned to one machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from oncelog.embedded import ClusterProcess
from oncelog.records.builder import build_batch
from tests.integration.helpers import produce_raw
from tests.support.wire import Wire

SESSION_MS = 6000                      # comfortably above a loaded two-core machine's pauses
SETTINGS = {
    "oncelog.coordination.session.timeout.ms": SESSION_MS,
    # no leader balance moving leaderships under a test (neither the periodic check nor the one a few seconds
    # after a broker restarts); tests/cluster/test_leader_balance.py turns it on
    "auto.leader.rebalance.enable": False,
    "leader.imbalance.check.interval.seconds": 3600,
}
START_S = 120.0


def converge_s(session_ms: int = SESSION_MS) -> float:
    """How long a change may take to show: a session to expire, an election, watches, clients' retries."""
    return 4 * session_ms / 1000 + 20


def wait_for(predicate: Callable[[], Any], what: str, timeout: float | None = None) -> Any:
    """Poll `predicate` until it returns something true; errors while polling (a broker just killed) retry."""
    deadline = time.monotonic() + (timeout if timeout is not None else converge_s())
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - asked again until the deadline
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def partitions(c: ClusterProcess, topic: str, via: int | None = None) -> dict[int, Any]:
    """{partition: Metadata entry} of `topic` as broker `via` answers it (empty if unknown)."""
    md = c.metadata(via, [topic])
    (entry,) = md.topics
    return {p.partition_index: p for p in entry.partitions} if entry.error_code == 0 else {}


def request(c: ClusterProcess, node: int, message: Any, version: int, timeout: float = 60.0) -> Any:
    """One request to broker `node`; the decoded response."""
    with Wire(c.brokers[node].bootstrap, timeout=timeout) as w:
        return w.request(message, version)


def produce(c: ClusterProcess, node: int, topic: str, partition: int, values: list[bytes], acks: int = -1,
            timeout_ms: int = 30000) -> tuple[int, int]:
    """A raw Produce of one batch to broker `node`: (error code, base offset)."""
    batch = build_batch([(None, v, (), int(time.time() * 1000)) for v in values])
    with Wire(c.brokers[node].bootstrap, timeout=timeout_ms / 1000 + 10) as w:
        part = produce_raw(w, topic, partition, batch, acks=acks, timeout_ms=timeout_ms)
    return part.error_code, part.base_offset
