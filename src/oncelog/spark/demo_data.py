"""The demo's data: a deterministic stream of shop events, what the pipeline must make of it, and the verdict.

Event i is a pure function of i, so the verifier knows the exact expected output without keeping anything
from the generator: every purchase event once, as `user:id:cents`, and nothing else.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from oncelog.client import Consumer, Producer
from oncelog.client.admin import Admin
from oncelog.client.types import TopicPartition

ACTIONS = ("view", "view", "cart", "purchase", "purchase")
USERS = 50
SESSIONS = 97


def event(i: int) -> tuple[bytes, bytes]:
    """(key, value) of event i: keyed by session, as a web front end would write it."""
    action = ACTIONS[(i * 31) % len(ACTIONS)]
    body = {"id": i, "user": f"u{(i * 7919) % USERS}", "action": action, "cents": 100 + (i * 37) % 9900}
    return f"s{i % SESSIONS}".encode(), json.dumps(body, separators=(",", ":")).encode()


def expected_output(count: int) -> list[bytes]:
    """What the pipeline must write for events 0..count-1: one `user:id:cents` per purchase."""
    out = []
    for i in range(count):
        body = json.loads(event(i)[1])
        if body["action"] == "purchase":
            out.append(f"{body['user']}:{body['id']}:{body['cents']}".encode())
    return out


class Generator(threading.Thread):
    """Writes events at about `rate` per second for `seconds`, with an idempotent producer (acks=all).
    `settings`: more producer settings (security.protocol, sasl.*, ssl.* ...)."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seconds: float,
                 settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(name="demo-generator", daemon=True)
        self.bootstrap, self.topic, self.rate, self.seconds = bootstrap, topic, rate, seconds
        self.settings = dict(settings or {})
        self.produced = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = Producer({"linger.ms": 20, **self.settings, "bootstrap.servers": self.bootstrap})
            start = time.monotonic()
            tick = 0.05
            while (elapsed := time.monotonic() - start) < self.seconds:
                due = int(elapsed * self.rate) + int(self.rate * tick)
                while self.produced < due:
                    key, value = event(self.produced)
                    producer.produce(self.topic, value, key)
                    self.produced += 1
                producer.poll(0)
                time.sleep(tick)
            if producer.flush(60):
                raise RuntimeError("the generator's last events were not acknowledged")
            producer.close()
        except BaseException as exc:  # reported by the demo's main loop
            self.error = exc


class Verdict(NamedTuple):
    expected: int
    read: int
    duplicates: int
    losses: int
    unexpected: int

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.losses == 0 and self.unexpected == 0 and self.read == self.expected


def judge(got: Iterable[bytes], expected: Sequence[bytes]) -> Verdict:
    counts = Counter(got)
    want = set(expected)
    return Verdict(expected=len(expected), read=sum(counts.values()),
                   duplicates=sum(c - 1 for c in counts.values() if c > 1),
                   losses=len(want - set(counts)), unexpected=len(set(counts) - want))


def read_committed(bootstrap: str, topic: str, timeout: float = 60.0,
                   settings: Mapping[str, Any] | None = None,
                   consumer_settings: Mapping[str, Any] | None = None) -> list[bytes]:
    """Every value in `topic` up to its last stable offset, read with read_committed. `settings`: more admin
    client settings, `consumer_settings` more consumer settings (default: `settings`)."""
    admin = Admin({**(settings or {}), "bootstrap.servers": bootstrap})
    try:
        parts = admin.topic_partitions(topic)
        ends = {(tp.topic, tp.partition): o.offset for tp, o in admin.list_offsets(
            {(tp.topic, tp.partition): "latest" for tp in parts}, isolation="read_committed").items()}
    finally:
        admin.close()
    extra = consumer_settings if consumer_settings is not None else settings
    consumer = Consumer({**(extra or {}), "bootstrap.servers": bootstrap, "isolation.level": "read_committed",
                         "enable.auto.commit": "false"})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(t, p, 0) for (t, p) in ends])
        deadline = time.monotonic() + timeout
        pending = {tp for tp, end in ends.items() if end > 0}
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"partitions {sorted(pending)} of {topic} not read to their end in {timeout} s")
            for msg in consumer.consume(5000, 0.5):
                if msg.error() is None:
                    values.append(msg.value())
            done = {tp for tp in pending
                    if consumer.position([TopicPartition(*tp)])[0].offset >= ends[tp]}
            pending -= done
    finally:
        consumer.close()
    return values
