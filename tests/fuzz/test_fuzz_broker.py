"""End-to-end fuzzing: damaged requests of every API and version, over TCP, to a real broker.

Oracles: the broker process never dies and keeps answering a fresh client; every answer it gives carries the
correlation id of the request it answers; and no handler fails with anything but a ProtocolError (the
dispatcher logs any other exception with a traceback before closing the connection: each one is a decoder or
handler bug that bad input reached). Bounded by FUZZ_E2E_EXAMPLES requests and FUZZ_SECONDS.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import corpus
from tests.fuzz.mutate import FUZZ_SETTINGS, SECONDS, damaged, record_iterations
from tests.integration.helpers import Wire, api_versions_ok, create_topic, produce_raw
from tests.support.broker import BrokerProcess

E2E_EXAMPLES = int(os.environ.get("FUZZ_E2E_EXAMPLES", "1500"))
REQUESTS = corpus.request_bodies()
API_VERSIONS = sorted(REQUESTS)
ANSWER_WAIT_S = 0.15
HEALTH_EVERY = 100


class Client:
    """One connection, reused while the broker answers; replaced when it closes or stays silent."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.sock: socket.socket | None = None

    def send(self, payload: bytes) -> bytes | None:
        """Send, then the answer frame, or None when the broker closed the connection or did not answer."""
        if self.sock is None:
            host, port = self.bootstrap.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=5)
        sock = self.sock
        try:
            sock.sendall(payload)
            sock.settimeout(ANSWER_WAIT_S)
            head = self._exact(4)
            sock.settimeout(5)
            return self._exact(struct.unpack(">i", head)[0])
        except (OSError, ConnectionError):
            self.close()
            return None

    def _exact(self, n: int) -> bytes:
        assert self.sock is not None
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("closed")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("fuzz") / "data", {
        "num.partitions": 1, "transaction.state.log.num.partitions": 2, "offsets.topic.num.partitions": 2,
    }).start()
    create_topic(broker.bootstrap, corpus.TOPIC, 3)
    with Wire(broker.bootstrap) as w:
        for p in range(3):
            for batch in corpus.record_batches()[:6]:
                produce_raw(w, corpus.TOPIC, p, batch)
    state = {"broker": broker, "client": Client(broker.bootstrap), "sent": 0, "answered": 0, "closed": 0,
             "deadline": time.monotonic() + SECONDS}
    yield state
    state["client"].close()
    alive = broker.alive()
    record_iterations("broker over TCP", state["sent"])
    print(f"fuzzed the broker with {state['sent']} requests: {state['answered']} answered, "
          f"{state['closed']} closed or unanswered")
    if alive:
        broker.stop()
    assert alive, "the broker died"


def _inputs(api_version: tuple[int, int]) -> st.SearchStrategy:
    return st.tuples(st.just(api_version), damaged(REQUESTS[api_version]), st.integers(0, 19))


@settings(FUZZ_SETTINGS, max_examples=E2E_EXAMPLES)
@given(st.sampled_from(API_VERSIONS).flatmap(_inputs))
def test_broker_survives_damaged_requests(fuzz_broker, case):
    if time.monotonic() > fuzz_broker["deadline"]:
        return
    (api_key, version), body, twist = case
    correlation_id = 1000 + fuzz_broker["sent"]
    frame = corpus.frame(api_key, version, body, correlation_id)
    if twist == 0:  # damage the header too
        frame = frame[:4] + bytes([frame[4] ^ 0x01]) + frame[5:]
    size = len(frame) if twist != 1 else len(frame) + 3  # a size prefix that lies
    answer = fuzz_broker["client"].send(struct.pack(">i", size) + frame)
    fuzz_broker["sent"] += 1
    if answer is None:
        fuzz_broker["closed"] += 1
    else:
        fuzz_broker["answered"] += 1
        if twist != 0:
            assert struct.unpack_from(">i", answer)[0] == correlation_id, "answer to another request"
    if fuzz_broker["sent"] % HEALTH_EVERY == 0:
        broker: BrokerProcess = fuzz_broker["broker"]
        assert broker.alive(), "the broker died"
        assert api_versions_ok(broker.bootstrap), "the broker stopped answering a well-formed request"


def handler_failures(log_text: str) -> list[str]:
    """"<API vN>: <exception line>" for every handler failure the dispatcher logged (with its traceback)."""
    lines = log_text.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = re.search(r"handler for (\S+ v\d+) failed", line)
        if match is None:
            continue
        error = next((ln for ln in lines[i + 1:] if ln and not ln.startswith((" ", "Traceback", "^"))), "?")
        found.append(f"{match.group(1)}: {error}")
    return found


def test_no_handler_failed_on_bad_input(fuzz_broker):
    """Runs after the fuzzing above (same module broker): every rejection was a ProtocolError."""
    broker: BrokerProcess = fuzz_broker["broker"]
    assert api_versions_ok(broker.bootstrap)
    text = broker.log_path.read_text(errors="replace")
    reasons = Counter(re.findall(r"closing connection from \S+: ([a-zA-Z ]+)", text))
    print("connections the broker closed, by reason:", dict(reasons.most_common()))
    distinct = sorted(set(handler_failures(text)))
    assert not distinct, "handlers failed on bad input:\n" + "\n".join(distinct[:20])


def test_handler_failures_are_found_in_the_log():
    sample = ("2026-01-01 ERROR oncelog.dispatch: handler for METADATA v12 failed; closing connection from x\n"
              "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    raise KeyError(1)\n"
              "KeyError: 1\n2026-01-01 INFO next line\n")
    assert handler_failures(sample) == ["METADATA v12: KeyError: 1"]
