"""A consumer that goes away while the broker is still sending it a large Fetch response (the sendfile path) is a
normal event: the broker logs it at DEBUG in one line, never an ERROR with a BrokenPipeError or
ConnectionResetError traceback, and goes on serving."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys

from kafka.protocol.consumer import FetchRequest
from tests.integration.helpers import ck_consume, ck_producer, create_topic, encode_framed

_BIG = 64 << 20


def _fetch_everything(topic: str) -> bytes:
    req = FetchRequest[11]
    ft = req.FetchTopic
    fp = ft.FetchPartition
    message = req(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=_BIG, isolation_level=0,
                  session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                  topics=[ft(topic=topic, partitions=[fp(partition=0, fetch_offset=0, log_start_offset=-1,
                                                          partition_max_bytes=_BIG, current_leader_epoch=-1)])])
    return encode_framed(message, 11)


def _abandon_a_fetch(port: int, request: bytes, how: str) -> None:
    """Send the Fetch, read the start of its answer (the broker is now mid-send), then go: "reset" closes with
    RST (SO_LINGER 0: the broker's send meets ECONNRESET), "close" with unread data (Linux answers the broker's
    next segment with RST: EPIPE)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(request)
    (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
    assert size > 16 << 20  # the answer is far larger than what socket buffers hold
    sock.recv(1024)
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_client_gone_during_a_large_fetch_is_not_an_error(tmp_path, topic_name):
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oncelog", "serve", "--data-dir", str(tmp_path / "data"),
             "--listen", "127.0.0.1:0", "--log-level", "DEBUG"],
            stdout=subprocess.PIPE, stderr=log_file, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("oncelog listening on "), log_path.read_text()
        bootstrap = line.split()[-1]
        create_topic(bootstrap, topic_name, 1)
        producer = ck_producer(bootstrap, **{"linger.ms": 20})
        value = b"v" * 100_000
        for _ in range(320):  # 32 MB
            producer.produce(topic_name, value, partition=0)
        assert producer.flush(60) == 0
        request = _fetch_everything(topic_name)
        port = int(bootstrap.rsplit(":", 1)[1])
        for how in ("reset", "close") * 3:
            _abandon_a_fetch(port, request, how)
        # still serving: the next record is produced and consumed
        producer.produce(topic_name, b"after", partition=0)
        assert producer.flush(30) == 0
        records = ck_consume(bootstrap, topic_name, {0: 320})
        assert [r.value for r in records] == [b"after"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    log_text = log_path.read_text()
    assert " ERROR " not in log_text and "Traceback" not in log_text, log_text[-3000:]
    assert "BrokenPipeError" not in log_text and "ConnectionResetError" not in log_text
    # each departure is one DEBUG line (a send cut short by the loss itself ends without one)
    gone = [ln for ln in log_text.splitlines() if "went away while a response was being sent" in ln]
    assert 1 <= len(gone) <= 6 and all(" DEBUG oncelog.connection: client 127.0.0.1:" in ln for ln in gone)
