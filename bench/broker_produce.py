"""The broker's own cost of idempotence: produce throughput and broker CPU with pre-built requests.

`produce_fetch.py` measures end to end through a client, and each client pipelines idempotent
batches differently (librdkafka keeps about one request in flight per idempotent partition, the
Java client five). This script takes the client out: every Produce request (v9, acks=all, one
~1 MB batch of 1 KiB records) is built before the clock starts, one connection per partition keeps
`--window` requests in flight, and the same bytes go out with and without a producer id. What
differs between the modes is only what the broker does: the producer-state check and bookkeeping.

Prints the median of `--runs` runs per mode (modes alternate and flip order each round) and
writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.produce_fetch import cpu_seconds  # noqa: E402
from tests.support.wire import Wire  # noqa: E402

from oncelog.embedded import BrokerProcess  # noqa: E402
from oncelog.records.batch import OFF_BASE_SEQUENCE, OFF_PRODUCER_EPOCH, OFF_PRODUCER_ID, rewrite_crc  # noqa: E402
from oncelog.records.builder import build_batch  # noqa: E402

assert OFF_PRODUCER_EPOCH == OFF_PRODUCER_ID + 8 and OFF_BASE_SEQUENCE == OFF_PRODUCER_EPOCH + 2

RECORD = 1024
RECORDS_PER_BATCH = 960  # ~1 MB: under message.max.bytes
PARTITIONS = 4
VERSION = 9


def _frame(topic: str, partition: int, batch: bytes, correlation_id: int) -> bytes:
    req = ProduceRequest[VERSION]
    td = req.TopicProduceData
    pd = td.PartitionProduceData
    message = req(transactional_id=None, acks=-1, timeout_ms=30000,
                  topic_data=[td(name=topic, partition_data=[pd(index=partition, records=batch)])])
    message.with_header(correlation_id=correlation_id, client_id="bench")
    return bytes(message.encode(version=VERSION, header=True, framed=True))


def build_requests(topic: str, total_bytes: int, producer: tuple[int, int] | None) -> list[list[bytes]]:
    """Per partition, its Produce frames in order; idempotent batches carry consecutive sequences."""
    template = build_batch([(None, b"x" * RECORD)] * RECORDS_PER_BATCH)
    per_partition = max(1, total_bytes // len(template) // PARTITIONS)
    frames: list[list[bytes]] = []
    for partition in range(PARTITIONS):
        out = []
        for i in range(per_partition):
            batch = bytearray(template)
            if producer is not None:
                # producer id, epoch and base sequence are adjacent header fields
                struct.pack_into(">qhi", batch, OFF_PRODUCER_ID, producer[0], producer[1], i * RECORDS_PER_BATCH)
                rewrite_crc(batch, 0, len(batch))
            out.append(_frame(topic, partition, bytes(batch), i + 1))
        frames.append(out)
    return frames


def _drive(bootstrap: str, frames: list[bytes], window: int, errors: list[int]) -> None:
    """Send `frames` on one connection with at most `window` unanswered; check every answer."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    slots = threading.Semaphore(window)
    done = threading.Event()

    def read_answers() -> None:
        buf = sock.makefile("rb")
        for _ in frames:
            size = struct.unpack(">i", buf.read(4))[0]
            body = buf.read(size)
            error_code = _first_error_code(body)
            if error_code:
                errors.append(error_code)
            slots.release()
        done.set()

    reader = threading.Thread(target=read_answers, daemon=True)
    reader.start()
    for frame in frames:
        slots.acquire()
        sock.sendall(frame)
    done.wait(300)
    sock.close()


def _first_error_code(frame: bytes) -> int:
    """Error code of the only partition of a v9 (flexible) Produce response.

    Layout: correlation id (4), header tags (1), topics length (1), topic name (compact string,
    1-byte length for short names), partitions length (1), partition index (4), error code (2).
    """
    name_len = frame[6] - 1
    return struct.unpack_from(">h", frame, 7 + name_len + 1 + 4)[0]


def one_run(total_bytes: int, idempotent: bool, window: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp, \
            BrokerProcess(Path(tmp) / "data") as broker:
        topic = "bench"
        with Wire(broker.bootstrap) as w:
            req = CreateTopicsRequest[4](topics=[CreateTopicsRequest[4].CreatableTopic(
                name=topic, num_partitions=PARTITIONS, replication_factor=1, assignments=[], configs=[])],
                timeout_ms=10000, validate_only=False)
            w.request(req, 4)
            producer = None
            if idempotent:
                resp = w.request(InitProducerIdRequest[1](transactional_id=None, transaction_timeout_ms=60000), 1)
                assert resp.error_code == 0, resp
                producer = (resp.producer_id, resp.producer_epoch)
        frames = build_requests(topic, total_bytes, producer)
        sent = sum(len(f) for part in frames for f in part)
        errors: list[int] = []
        cpu0 = cpu_seconds(broker.proc.pid)
        started = time.perf_counter()
        threads = [threading.Thread(target=_drive, args=(broker.bootstrap, part, window, errors)) for part in frames]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(broker.proc.pid) - cpu0
    return {"mb_s": sent / elapsed / 1e6, "requests_s": sum(map(len, frames)) / elapsed,
            "cpu_s_per_gib": cpu / (sent / (1 << 30)), "errors": len(errors), "bytes": sent}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="MiB produced per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=int, default=5, help="requests in flight per connection (partition)")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"idempotent": [], "plain": []}
    order = ["idempotent", "plain"]
    for i in range(args.runs):
        for mode in (order if i % 2 == 0 else order[::-1]):
            runs[mode].append(one_run(args.mb << 20, mode == "idempotent", args.window))
            print(f"  run {i + 1} {mode}: {runs[mode][-1]['mb_s']:.1f} MB/s", file=sys.stderr)
    print(f"broker produce, pre-built v{VERSION} requests, ~1 MB batches of 1 KiB records, {PARTITIONS} partitions, "
          f"acks=all, window {args.window}, {args.mb} MiB per run, median of {args.runs}")
    print(f"{'mode':<12}{'MB/s':>10}{'requests/s':>12}{'broker CPU s/GiB':>18}{'errors':>8}")
    med = {}
    for mode, results in runs.items():
        med[mode] = {k: statistics.median(r[k] for r in results) for k in ("mb_s", "requests_s", "cpu_s_per_gib")}
        errs = sum(r["errors"] for r in results)
        print(f"{mode:<12}{med[mode]['mb_s']:>10.1f}{med[mode]['requests_s']:>12.1f}"
              f"{med[mode]['cpu_s_per_gib']:>18.2f}{errs:>8}")
    cost = 1 - med["idempotent"]["mb_s"] / med["plain"]["mb_s"]
    cpu = med["idempotent"]["cpu_s_per_gib"] / med["plain"]["cpu_s_per_gib"] - 1
    print(f"idempotence: {cost * 100:.1f}% less throughput, {cpu * 100:+.1f}% broker CPU per GiB")
    out = Path(__file__).resolve().parent / "results" / f"broker_produce-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": runs, "median": med}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
