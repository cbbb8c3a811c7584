"""The controlled shutdown keys change what a SIGTERM'd broker of a real cluster does (issue 21: every accepted key
shown to matter; docs/config-keys.md).

- controlled.shutdown.enable: on, the stopping broker's leaderships move while it is still registered (another
  broker's Metadata names the new leader and still lists the stopping broker); off, they move only once its
  registration is gone (the session closed at the end of its stop), never before. Asserted in ZooKeeper's own
  order (zxids), which no sampling can miss; a client polling Metadata through the other broker sees the new
  leader beside the stopping broker's registration when on (a window of some 10-40 ms: printed, not asserted),
  never when off (asserted). The stopping process is still alive in both cases when the leaderships move: its
  exit comes after the session's close, so "moved before the process exited" would not tell the two apart.
- controlled.shutdown.max.retries, controlled.shutdown.retry.backoff.ms: an attempt fails when ZooKeeper stalls
  under the controller's write (SIGSTOPped: the write ends in a connection loss, the partition stays led by the
  stopping broker while the other in-sync replica lives, so the broker retries). ZooKeeper is resumed as soon as
  the first attempt is logged; with retries the second attempt, one backoff later, moves the leadership; with
  max.retries=0 the broker stops at once with it. The gaps are read from the broker's own log timestamps.

The shortcut in cluster_mode.controlled_shutdown that stops at once when no other live in-sync replica exists (an
RF 2 topic whose follower left the ISR) never retries, whatever the keys say: a retry needs an attempt that fails
while another in-sync replica lives, i.e. a controller or ZooKeeper failure during the attempt.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest

from tests.cluster.cluster_processes import SESSION_MS, converge_s, partitions, wait_for
from tests.support.wire import Wire

# The crash probe would remove a registration as soon as the stopping broker's port refuses connections, a step
# of its own between the listener's close and the session's; off, the registration goes only with the session.
NO_PROBE = {"oncelog.controller.broker.probe.interval.ms": 0}


def create(c: Any, name: str, partitions_: int, rf: int) -> None:
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions_, replication_factor=rf)],
                                      operation_timeout=30).values():
        future.result(60)


def in_sync(c: Any, topic: str, count: int, replicas: int) -> None:
    """Until every broker's Metadata shows `count` partitions of `topic`, each with a leader and all `replicas`
    in its ISR."""
    for node in c.brokers:
        wait_for(lambda node=node: len(parts := partitions(c, topic, via=node)) == count
                 and all(p.leader_id >= 0 and len(p.isr_nodes) == replicas for p in parts.values()),
                 f"{topic} in sync as broker {node} sees it", converge_s())


class MetadataPoller(threading.Thread):
    """Metadata of one topic from broker `via`, as fast as it answers over one connection: samples of
    (monotonic time, live broker ids, {partition: leader})."""

    def __init__(self, c: Any, via: int, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = c.brokers[via].bootstrap
        self.topic = topic
        self.samples: list[tuple[float, set[int], dict[int, int]]] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        req = MetadataRequest[1]
        with Wire(self.bootstrap, timeout=30) as w:
            while not self.done.is_set():
                try:
                    md = w.request(req(topics=[self.topic]), 1)
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    self.errors.append(repr(exc))
                    return
                (entry,) = md.topics
                self.samples.append((time.monotonic(), {b[0] for b in md.brokers},
                                     {p[1]: p[2] for p in entry[3]}))
                time.sleep(0.002)


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
def test_controlled_shutdown_enable_moves_leaderships_while_the_broker_is_still_registered(cluster_factory,
                                                                                            kazoo_client, enabled):
    c = cluster_factory(2, **NO_PROBE, **{"controlled.shutdown.enable": enabled})
    zk = kazoo_client(c.connect)
    create(c, "moving", 2, 2)
    in_sync(c, "moving", 2, 2)
    led = partitions(c, "moving")
    victim = led[0].leader_id
    other = next(n for n in c.brokers if n != victim)
    moved = [p for p, s in led.items() if s.leader_id == victim]
    poller = MetadataPoller(c, other, "moving")
    poller.start()
    wait_for(lambda: len(poller.samples) > 5, "the poller's first answers", 30)
    proc = c.brokers[victim].proc
    started = time.monotonic()
    code = c.stop_broker(victim, timeout=converge_s())
    exited = time.monotonic()
    # The leaderships reach the survivor either way (a clean stop closes the session: no session timeout).
    wait_for(lambda: all(s[2].get(p) == other for p in moved for s in poller.samples[-1:]),
             "the survivor leading what the stopped broker led", converge_s())
    poller.done.set()
    poller.join(30)
    assert proc is not None and code == 0 and poller.errors == []
    assert exited - started < SESSION_MS / 1000
    # ZooKeeper's own order: the zxid of each moved partition's last state write (the election; nothing writes it
    # afterwards) against the zxid of the last change of /brokers/ids' children (the registration's end).
    gone_at = zk.get("/brokers/ids")[1].pzxid
    assert str(victim) not in zk.get_children("/brokers/ids")
    written_at = {p: zk.get(f"/topics/moving/partitions/{p}/state")[1].mzxid for p in moved}
    # Samples in which the survivor names itself leader of every moved partition while the stopping broker is
    # still registered: the move came from the controlled shutdown, not from the registration's end.
    before_gone = [t for t, live, leaders in poller.samples
                   if victim in live and all(leaders.get(p) == other for p in moved)]
    first_moved = min(t for t, _, leaders in poller.samples if all(leaders.get(p) == other for p in moved))
    last_registered = max(t for t, live, _ in poller.samples if victim in live)
    print(f"enabled={enabled}: moved {first_moved - started:.3f} s after SIGTERM, registration seen until "
          f"{last_registered - started:.3f} s, exit at {exited - started:.3f} s, {len(before_gone)} samples with "
          f"both, {len(poller.samples)} samples")
    if enabled:
        assert all(z < gone_at for z in written_at.values()), (written_at, gone_at)
        assert "controlled shutdown done" in c.brokers[victim].log_tail(200)
    else:
        assert all(z > gone_at for z in written_at.values()), (written_at, gone_at)
        # and no client could have seen the new leader beside the stopping broker's registration
        assert not before_gone, before_gone


# A ZooKeeper stall is noticed by kazoo after 2/3 of the session timeout (its read timeout): the first attempt fails
# then, and ZooKeeper resumes right after, a third of the session before a broker's session could expire. The seat
# session is long as well, so that the controller, slow to get the request on a loaded machine, has not stepped
# down yet (its seat's connection lost) when the request comes: it then answers NOT_CONTROLLER and the attempt
# waits for a controller up to twice the session timeout instead of failing.
STALL_SESSION_MS = 10000
STALL_SETTINGS = {"oncelog.coordination.session.timeout.ms": STALL_SESSION_MS,
                  "oncelog.controller.session.timeout.ms": STALL_SESSION_MS // 2}


def _stamp(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _first(lines: list[str], text: str) -> str | None:
    return next((line for line in lines if text in line), None)


def stop_through_a_coordination_stall(c: Any, coordination: Any, victim: int, timeout: float) -> list[str]:
    """SIGSTOP ZooKeeper and SIGTERM `victim` at once, SIGCONT ZooKeeper as soon as the victim logs a failed
    attempt; wait for the victim to exit. Its log lines from the SIGTERM on."""
    broker = c.brokers[victim]
    assert broker.proc is not None and coordination.pid is not None
    start = len(broker.log_path.read_bytes())
    deadline = time.monotonic() + timeout
    os.kill(coordination.pid, signal.SIGSTOP)
    try:
        broker.proc.send_signal(signal.SIGTERM)
        while time.monotonic() < deadline:
            text = broker.log_path.read_bytes()[start:].decode(errors="replace")
            if "controlled shutdown attempt 1/" in text or broker.proc.poll() is not None:
                break
            time.sleep(0.02)
    finally:
        os.kill(coordination.pid, signal.SIGCONT)
    code = broker.proc.wait(max(deadline - time.monotonic(), 1.0))
    broker.reap()
    assert code == 0
    return broker.log_path.read_bytes()[start:].decode(errors="replace").splitlines()


@pytest.mark.parametrize(("retries", "backoff_ms"), [(0, 4000), (2, 1500)], ids=["no-retry", "two-retries"])
def test_controlled_shutdown_retries_after_a_failed_attempt(cluster_factory, coordination, retries, backoff_ms):
    c = cluster_factory(2, **NO_PROBE, **STALL_SETTINGS, **{"controlled.shutdown.max.retries": retries,
                                                           "controlled.shutdown.retry.backoff.ms": backoff_ms})
    create(c, "stalled", 2, 2)
    in_sync(c, "stalled", 2, 2)
    controller = c.controller()
    victim = next(n for n in c.brokers if n != controller)
    other = controller
    assert any(s.leader_id == victim for s in partitions(c, "stalled").values())
    # the first attempt fails after ~2/3 of the session; then the backoff, a second attempt, the stop
    lines = stop_through_a_coordination_stall(c, coordination, victim,
                                              timeout=3 * STALL_SESSION_MS / 1000 + backoff_ms / 1000 + 30)
    first = _first(lines, "controlled shutdown attempt 1/")
    assert first is not None, "\n".join(lines[-40:])
    stopped = _first(lines, "broker stopped cleanly")
    assert stopped is not None
    done = _first(lines, "controlled shutdown done")
    print(f"retries={retries} backoff={backoff_ms} ms: attempt 1 failed at {first[:23]}, done "
          f"{'-' if done is None else f'{_stamp(done) - _stamp(first):.3f} s'} later, stopped "
          f"{_stamp(stopped) - _stamp(first):.3f} s later")
    if retries == 0:
        # no second attempt, no pause: the broker stops right after the failed one
        assert done is None and _first(lines, "controlled shutdown incomplete") is not None
        assert _stamp(stopped) - _stamp(first) < backoff_ms / 1000, "\n".join(lines[-40:])
    else:
        # one backoff later the second attempt, ZooKeeper back, moves the leadership before the broker stops
        assert done is not None and "no leadership left here" in done, "\n".join(lines[-40:])
        assert _first(lines, "controlled shutdown incomplete") is None
        gap = _stamp(done) - _stamp(first)
        assert backoff_ms / 1000 <= gap < backoff_ms / 1000 + 3.0, gap
    wait_for(lambda: all(s.leader_id == other for s in partitions(c, "stalled", via=other).values()),
             "the survivor leading every partition", converge_s(STALL_SESSION_MS))
    # the failed attempt: the controller's write lost with ZooKeeper's connection, the other replica in sync
    assert f"attempt 1/{retries + 1}: NONE, still leading stalled-" in first, first
