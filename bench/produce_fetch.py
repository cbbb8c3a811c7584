"""Produce and fetch throughput of one oncelog broker, measured with confluent-kafka (librdkafka).

Each run starts a fresh broker on loopback (temp data dir, fsync on), creates a topic,
produces `--mb` MiB of 1 KiB records with acks=all and linger 5 ms (idempotence on and
off), then reads everything back with one consumer. Prints a table of the median of
`--runs` runs and writes JSON to bench/results/.

With `--rate-mb R` it measures latency instead: each run offers R MB/s (idempotent, acks=all, linger
`--linger-ms`) for `--seconds` to a fresh broker and reports librdkafka's msg.latency() p50/p99/p99.9/max and
the count of samples over 30 ms (bench/paced.py), median of the runs. `--systems oncelog,kafka` runs Apache
Kafka 4.4 (one KRaft node, tests/support/kafka.py) through the same script, interleaved run by run (issue 24's
side by side); each run also measures the machine's fdatasync of a 1 KiB append in the broker's directory, the
floor of the fsync path's p50.

With `--topic-compression producer,gzip,...` each mode runs once per topic compression.type (issue 21): the
producer sends uncompressed batches, and the broker recompresses them to the topic's codec; `--value text`
makes the records compressible text instead of one repeated byte.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest, FetchResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.paced import paced_produce  # noqa: E402

from oncelog.embedded import BrokerProcess  # noqa: E402

RECORD = 1024
PARTITIONS = 4


def text_value(size: int = RECORD) -> bytes:
    """Compressible but not trivial text: words drawn from a small vocabulary (a log line's worth of entropy)."""
    import random

    rng = random.Random(21)
    words = [("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))).encode()
             for _ in range(500)]
    out = b""
    while len(out) < size:
        out += rng.choice(words) + b" "
    return out[:size]


VALUE = b"x" * RECORD


def produce(bootstrap: str, topic: str, total_bytes: int, idempotent: bool) -> dict:
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": idempotent,
        "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1_048_576, "queue.buffering.max.messages": 1_000_000,
    })
    latencies: list[float] = []
    errors = [0]

    def delivered(err, msg):
        if err is not None:
            errors[0] += 1
        else:
            latencies.append(msg.latency())

    value = VALUE
    count = total_bytes // RECORD
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "records": count, "seconds": elapsed, "mb_per_s": count * RECORD / elapsed / 1e6,
        "records_per_s": count / elapsed, "errors": errors[0],
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else None,
    }


def consume(bootstrap: str, topic: str, expected: int) -> dict:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
        "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
        "queued.max.messages.kbytes": 1_048_576,
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = 0
    nbytes = 0
    started = time.perf_counter()
    deadline = started + 300
    while seen < expected and time.perf_counter() < deadline:
        for msg in consumer.consume(10000, 1.0):
            if msg.error() is None:
                seen += 1
                nbytes += len(msg.value())
    elapsed = time.perf_counter() - started
    consumer.close()
    return {"records": seen, "seconds": elapsed, "mb_per_s": nbytes / elapsed / 1e6, "records_per_s": seen / elapsed}


def fetch_batches(bootstrap: str, topic: str, end_offsets: list[int]) -> dict:
    """Read the partitions back as record batches, the way a replica or a batch consumer does.

    This measures what the broker can serve: no per-record work on the client, one Fetch
    (v12, 4 partitions x 4 MiB) in flight at a time over one connection.
    """
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    req_cls = FetchRequest[12]
    offsets = [0] * len(end_offsets)
    nbytes = 0
    correlation = 0
    started = time.perf_counter()
    while any(o < e for o, e in zip(offsets, end_offsets, strict=True)):
        correlation += 1
        req = req_cls(
            replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=64 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, forgotten_topics_data=[], rack_id="",
            topics=[req_cls.FetchTopic(topic=topic, partitions=[
                req_cls.FetchTopic.FetchPartition(partition=p, fetch_offset=offsets[p], partition_max_bytes=4 << 20)
                for p in range(len(offsets)) if offsets[p] < end_offsets[p]
            ])],
        )
        req.with_header(correlation_id=correlation, client_id="bench")
        sock.sendall(bytes(req.encode(version=12, header=True, framed=True)))
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        frame = _recv_exact(sock, size)
        resp = FetchResponse.decode(frame[5:], version=12)
        for topic_resp in resp.responses:
            for part in topic_resp.partitions:
                records = part.records or b""
                nbytes += len(records)
                pos, last = 0, None
                while pos + 61 <= len(records):
                    base, length = struct.unpack_from(">qi", records, pos)
                    if pos + 12 + length > len(records):
                        break
                    last = base + struct.unpack_from(">i", records, pos + 23)[0]
                    pos += 12 + length
                if last is not None:
                    offsets[part.partition_index] = last + 1
    elapsed = time.perf_counter() - started
    sock.close()
    return {"seconds": elapsed, "mb_per_s": nbytes / elapsed / 1e6, "bytes": nbytes}


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("broker closed the connection")
        got += k
    return bytes(buf)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc), to see what the broker itself spends."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


JAVA_DIR = Path(__file__).resolve().parents[1] / "tests" / "interop" / "java"
JAVA_JAR = JAVA_DIR / "target" / "oncelog-java-interop.jar"


def build_java() -> None:
    """Build the Java interop program (it has a produce-bench subcommand) if it is missing."""
    if not JAVA_JAR.exists():
        subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "package"], cwd=JAVA_DIR, check=True, timeout=600)


def produce_java(bootstrap: str, topic: str, total_bytes: int, idempotent: bool) -> dict:
    """The Java producer (kafka-clients) with the same settings; it keeps 5 requests in flight when idempotent."""
    out = subprocess.run(
        ["java", "-jar", str(JAVA_JAR), "produce-bench", "--bootstrap", bootstrap, "--topic", topic,
         "--mb", str(total_bytes >> 20), "--partitions", str(PARTITIONS), "--idempotent", str(idempotent).lower(),
         "--deadline-s", "900"],
        capture_output=True, text=True, timeout=960,
    )
    result = json.loads(out.stdout)
    if "fatal" in result:
        raise RuntimeError(f"java producer failed: {result['fatal']}")
    return {"records": result["records"], "seconds": result["seconds"], "mb_per_s": result["mb_per_s"],
            "records_per_s": result["records_per_s"], "errors": result["errors"], "p50_ms": None, "p99_ms": None}


def one_run(total_bytes: int, idempotent: bool, client: str = "confluent", read: bool = True,
            compression_type: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            config = {"compression.type": compression_type} if compression_type else {}
            admin.create_topics([NewTopic("bench", PARTITIONS, 1, config=config)])["bench"].result(30)
            cpu_before = cpu_seconds(broker.proc.pid)
            producer = produce_java if client == "java" else produce
            p = producer(broker.bootstrap, "bench", total_bytes, idempotent)
            p["broker_cpu_s_per_gib"] = (cpu_seconds(broker.proc.pid) - cpu_before) / (total_bytes / (1 << 30))
            per_partition = [p["records"] // PARTITIONS + (1 if i < p["records"] % PARTITIONS else 0)
                             for i in range(PARTITIONS)]
            skipped = {"mb_per_s": None}
            f = fetch_batches(broker.bootstrap, "bench", per_partition) if read else skipped
            c = consume(broker.bootstrap, "bench", p["records"]) if read else skipped
        finally:
            broker.stop()
    return {"produce": p, "fetch": f, "consume": c}


def stall_summary(log_text: str) -> dict[str, Any]:
    """The broker's event-loop stall lines (broker/loop_monitor.py): how many, how long, and where, by the
    innermost frame of oncelog's own code in each stall's stack (GC named when a collection overlapped it)."""
    stalls: list[float] = []
    where: dict[str, list[float]] = {}
    for block in log_text.split("event loop stalled ")[1:]:
        head, _, rest = block.partition("\n")
        ms = float(head.split(" ms", 1)[0])
        stalls.append(ms)
        frames = [line.strip() for line in rest.splitlines() if line.startswith("  File ")]
        ours = [f for f in frames if "/oncelog/" in f]
        if frames and "selectors.py" in frames[-1]:
            site = "the loop in select(): the GIL or the CPU was elsewhere (another thread, another process)"
        elif not frames:
            site = "(no stack: over before the watchdog looked)"
        else:
            site = ours[-1].split("/oncelog/", 1)[1] if ours else frames[-1]
        if "garbage collection during it" in head:
            site = "GC " + head.split("garbage collection during it: ", 1)[1].split(";")[0] + " / " + site
        where.setdefault(site, []).append(ms)
    return {"count": len(stalls), "max_ms": max(stalls, default=0.0),
            "sites": {k: {"count": len(v), "max_ms": max(v)} for k, v in
                      sorted(where.items(), key=lambda kv: -max(kv[1]))}}


def slow_round_summary(log_text: str) -> dict[str, Any]:
    """The broker's slow fsync rounds (storage/flusher.py, oncelog.fsync.slow.round.ms): how many, the longest,
    and the disk's time in it. A latency sample over 30 ms with no loop stall but a round that long is the disk's
    own tail, which every acks=all answer after an fsync pays."""
    rounds: list[tuple[float, float]] = []
    for block in log_text.split("fsync round took ")[1:]:
        total = float(block.split(" ms", 1)[0])
        disk = float(block.split("the disk ", 1)[1].split(" ms", 1)[0])
        rounds.append((total, disk))
    longest = max(rounds, default=(0.0, 0.0))
    return {"count": len(rounds), "max_ms": longest[0], "max_disk_ms": longest[1],
            "disk_over_30ms": sum(1 for _, disk in rounds if disk >= 30)}


LATENCY_SYSTEMS = ("oncelog", "oncelog-syncfs", "oncelog-nofsync", "kafka", "kafka-flush1")
SLOW_ROUND_MS = "20"  # oncelog.fsync.slow.round.ms of the latency runs: rounds near the 30 ms goal are listed


def fdatasync_ms(directory: str, samples: int = 300) -> float:
    """The machine's fdatasync of one appended 1 KiB write (median), in the directory the broker writes to: the
    floor the issue's p50 goal is measured against."""
    path = Path(directory) / "fdatasync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"x" * RECORD)
        os.fsync(fd)
        for _ in range(samples):
            os.write(fd, b"x" * RECORD)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1000


def latency_run(system: str, rate_mb: float, seconds: float, linger_ms: float, warmup_s: float,
                broker_settings: dict[str, str] | None = None, kafka_setup: dict[str, str] | None = None,
                partitions: int = PARTITIONS) -> dict:
    """One paced run against a fresh broker of `system`: oncelog (fsync before the ack, its default),
    oncelog-syncfs (the same with oncelog.fsync.method=syncfs), oncelog-nofsync, kafka (Apache Kafka 4.4, one KRaft node, its default flush: the page cache) or kafka-flush1
    (the topic's flush.messages=1: an fsync per append)."""
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp:
        fsync_ms = fdatasync_ms(tmp)
        topic_config: dict[str, str] = {}
        log_path: Path | None = None
        slow_round_ms = (broker_settings or {}).get("oncelog.fsync.slow.round.ms", SLOW_ROUND_MS)
        if system.startswith("kafka"):
            from tests.support.kafka import KafkaCluster

            assert kafka_setup is not None
            handle = KafkaCluster(Path(tmp) / "kafka", java=kafka_setup["java"], classpath=kafka_setup["classpath"],
                                  settings=broker_settings or {}).start()
            bootstrap, pid = handle.bootstrap, handle.nodes[0].pid
            if system == "kafka-flush1":
                topic_config["flush.messages"] = "1"
        else:
            settings = {"oncelog.fsync.slow.round.ms": SLOW_ROUND_MS}
            if system == "oncelog-syncfs":
                settings["oncelog.fsync.method"] = "syncfs"
            elif system == "oncelog-nofsync":
                settings["oncelog.fsync.enable"] = "false"
            settings.update(broker_settings or {})
            handle = BrokerProcess(Path(tmp) / "data", settings=settings).start()
            bootstrap, pid, log_path = handle.bootstrap, handle.proc.pid, handle.log_path
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic("bench", partitions, 1, config=topic_config)])["bench"].result(30)
            time.sleep(1.0)  # leaders settled on both systems before the first record
            cpu_before = cpu_seconds(pid)
            result = paced_produce({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                    "linger.ms": linger_ms}, "bench", partitions, rate_mb, seconds, warmup_s)
            result["broker_cpu_share"] = (cpu_seconds(pid) - cpu_before) / (seconds + warmup_s)
        finally:
            handle.stop()
            log_text = log_path.read_text(errors="replace") if log_path else None
            result_stalls = stall_summary(log_text) if log_text is not None else None
            slow_rounds = slow_round_summary(log_text) if log_text is not None else None
    # The run's files are gone now, but not its writeback: Kafka leaves hundreds of MB dirty in the page cache,
    # and their writeback and the unlink's journal work would land in the next run's fsyncs (measured: a 45 ms
    # hiccup in the oncelog run after a Kafka run). Every run starts on a quiet disk.
    os.sync()
    time.sleep(2.0)
    result["system"] = system
    result["fdatasync_ms"] = fsync_ms
    result["stalls"] = result_stalls
    result["slow_fsync_rounds"] = slow_rounds
    result["over_30ms"] = result.pop("over_30ms", None)
    print(f"  {system:<16} p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms  "
          f"p99.9 {result['p999_ms']:.2f} ms  max {result['max_ms']:.1f} ms  >30 ms {result['over_30ms']}; "
          f"callback p50 {result['callback_p50_ms']:.2f} ms  (offered {result['offered_mb_per_s']:.1f} MB/s, "
          f"broker CPU {result['broker_cpu_share'] * 100:.0f}%, fdatasync {fsync_ms:.2f} ms, "
          f"errors {result['errors']})", flush=True)
    if slow_rounds and slow_rounds["count"]:
        print(f"    fsync rounds over {slow_round_ms} ms: {slow_rounds['count']}, longest "
              f"{slow_rounds['max_ms']:.1f} ms (the disk {slow_rounds['max_disk_ms']:.1f} ms of it); rounds with "
              f"the disk over 30 ms: {slow_rounds['disk_over_30ms']}")
    if result_stalls and result_stalls["count"]:
        print(f"    loop stalls: {result_stalls['count']}, longest {result_stalls['max_ms']:.1f} ms; by site:")
        for site, figures in list(result_stalls["sites"].items())[:8]:
            print(f"      {figures['count']:4d} x, max {figures['max_ms']:7.1f} ms  {site}")
    return result


def latency_main(args: argparse.Namespace) -> int:
    """Runs interleaved across systems (oncelog run 1, kafka run 1, oncelog run 2, ...), so both see the same
    machine; the medians per system."""
    extra = dict(item.split("=", 1) for item in args.broker_setting)
    systems = [s for s in args.systems.split(",") if s]
    if args.no_fsync:
        systems = ["oncelog-nofsync" if s == "oncelog" else s for s in systems]
    unknown = set(systems) - set(LATENCY_SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {', '.join(LATENCY_SYSTEMS)}")
    kafka_setup = None
    if any(s.startswith("kafka") for s in systems):
        from tests.support.kafka import KafkaUnavailable, java_executable, kafka_classpath

        try:
            kafka_setup = {"java": java_executable(), "classpath": kafka_classpath()}
        except KafkaUnavailable as exc:
            print(f"kafka skipped: {exc}")
            systems = [s for s in systems if not s.startswith("kafka")]
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for round_no in range(args.runs):
        print(f"round {round_no + 1} of {args.runs}", flush=True)
        for system in systems:
            # broker keys go to oncelog only: Kafka does not know oncelog's
            settings = extra if system.startswith("oncelog") else {}
            warmup = args.warmup_seconds if args.warmup_seconds is not None else max(1.0, args.seconds / 4)
            runs[system].append(latency_run(system, args.rate_mb, args.seconds, args.linger_ms, warmup, settings,
                                            kafka_setup, args.partitions))
    print(f"\nlatency at {args.rate_mb:g} MB/s, {RECORD} B records, {args.partitions} partitions, idempotent, acks=all, "
          f"linger {args.linger_ms:g} ms, {args.seconds:g} s a run; librdkafka's msg.latency(), median of "
          f"{args.runs} runs [min..max]")
    print(f"{'system':<17}{'p50 ms':>20}{'p99 ms':>22}{'p99.9 ms':>22}{'max ms':>22}{'>30 ms':>8}{'CPU':>6}")
    summary: dict[str, dict[str, Any]] = {}
    for system, rs in runs.items():
        row: dict[str, Any] = {}
        cells = []
        for key, width in (("p50_ms", 20), ("p99_ms", 22), ("p999_ms", 22), ("max_ms", 22)):
            values = [r[key] for r in rs]
            row[key] = statistics.median(values)
            cells.append(f"{row[key]:.2f} [{min(values):.1f}..{max(values):.1f}]".rjust(width))
        row["over_30ms"] = sum(r["over_30ms"] for r in rs)
        row["broker_cpu_share"] = statistics.median(r["broker_cpu_share"] for r in rs)
        row["fdatasync_ms"] = statistics.median(r["fdatasync_ms"] for r in rs)
        summary[system] = row
        print(f"{system:<17}{''.join(cells)}{row['over_30ms']:>8}{row['broker_cpu_share'] * 100:>5.0f}%")
    fsync = statistics.median(r["fdatasync_ms"] for rs in runs.values() for r in rs)
    print(f"this machine's fdatasync of a 1 KiB append: {fsync:.2f} ms (median over the runs)")
    out = Path(__file__).parent / "results" / f"produce_latency-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"rate_mb": args.rate_mb, "partitions": args.partitions, "seconds": args.seconds, "linger_ms": args.linger_ms,
                               "broker_settings": extra, "fdatasync_ms": fsync, "summary": summary,
                               "runs": runs}, indent=2))
    print(f"results: {out}")
    return 0


def _num(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1024, help="MiB produced and read back per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="idempotent,plain", help="comma list of idempotent,plain")
    parser.add_argument("--client", choices=("confluent", "java"), default="confluent",
                        help="producer: confluent-kafka (librdkafka) or the Java client (needs java + mvn)")
    parser.add_argument("--produce-only", action="store_true", help="skip the fetch and consume phases")
    parser.add_argument("--rate-mb", type=float, default=None, help="measure latency at this offered rate instead")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured length of a latency run (after the warm-up)")
    parser.add_argument("--linger-ms", type=float, default=1.0, help="producer linger of a latency run")
    parser.add_argument("--warmup-seconds", type=float, default=None,
                        help="latency runs: seconds produced at the rate before measuring (default a quarter of "
                             "--seconds, at least 1: the first 20%% of the run, as the issue measured; a fresh JVM "
                             "needs it)")
    parser.add_argument("--no-fsync", action="store_true", help="latency run with oncelog.fsync.enable=false")
    parser.add_argument("--partitions", type=int, default=PARTITIONS,
                        help=f"latency runs: partitions of the topic, written round-robin (default {PARTITIONS}); "
                             "a flush round syncs each partition written since the last one")
    parser.add_argument("--systems", default="oncelog",
                        help="latency runs: comma list of " + ",".join(LATENCY_SYSTEMS) + ", interleaved run by run "
                             "(kafka: Apache Kafka 4.4, one KRaft node, jars from Maven Central; kafka-flush1: its "
                             "topic with flush.messages=1)")
    parser.add_argument("--broker-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker key for latency runs (repeatable), e.g. oncelog.loop.stall.threshold.ms=5: "
                             "each run then prints the broker's event-loop stalls by site")
    parser.add_argument("--topic-compression", default="",
                        help="comma list of topic compression.type values to run each mode with (e.g. "
                             "producer,gzip,zstd,lz4); the producer sends uncompressed batches")
    parser.add_argument("--value", choices=("x", "text"), default="x",
                        help="record value: one repeated byte, or compressible text")
    args = parser.parse_args()
    # SIGTERM (a kill, a timeout) unwinds like Ctrl-C, so each run's `finally` stops its brokers: they run in
    # process groups of their own and would otherwise outlive the benchmark.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    global VALUE
    if args.value == "text":
        VALUE = text_value()
    if args.rate_mb is not None:
        return latency_main(args)
    total = args.mb * 1024 * 1024
    codecs = [c for c in args.topic_compression.split(",") if c]
    modes = [f"{m}:{c}" for m in args.modes.split(",") for c in codecs] if codecs else args.modes.split(",")
    if args.client == "java":
        build_java()
    # Modes alternate run by run, and their order flips every round (A B, B A, ...): a run pays for the page-cache
    # writeback of the run before it, so a fixed order would bias the comparison by more than the effect measured.
    all_runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for round_no in range(args.runs):
        for mode in (modes if round_no % 2 == 0 else modes[::-1]):
            kind, _, codec = mode.partition(":")
            all_runs[mode].append(one_run(total, kind == "idempotent", args.client, not args.produce_only,
                                          codec or None))
    summary = {}
    for mode in modes:
        runs = all_runs[mode]

        def med(path: tuple[str, str], runs: list[dict] = runs) -> float | None:
            values = [r[path[0]][path[1]] for r in runs]
            return None if None in values else statistics.median(values)

        summary[mode] = {
            "produce_mb_per_s": med(("produce", "mb_per_s")),
            "produce_records_per_s": med(("produce", "records_per_s")),
            "produce_p50_ms": med(("produce", "p50_ms")),
            "produce_p99_ms": med(("produce", "p99_ms")),
            "fetch_mb_per_s": med(("fetch", "mb_per_s")),
            "consume_mb_per_s": med(("consume", "mb_per_s")),
            "broker_cpu_s_per_gib": med(("produce", "broker_cpu_s_per_gib")),
            "delivery_errors": sum(r["produce"]["errors"] for r in runs),
            "runs": runs,
        }
    print(f"\nproducer: {args.client}; produce/fetch, {args.mb} MiB of {RECORD} B records, {PARTITIONS} partitions, acks=all, linger 5 ms, "
          f"median of {args.runs}")
    print(f"{'mode':<20}{'produce MB/s':>14}{'records/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'broker CPU s/GiB':>18}"
          f"{'fetch MB/s':>12}{'consume MB/s':>14}{'errors':>8}")
    for mode, s in summary.items():
        p50, p99 = (f"{v:>9.1f}" if v is not None else f"{'-':>9}" for v in (s["produce_p50_ms"], s["produce_p99_ms"]))
        print(f"{mode:<20}{s['produce_mb_per_s']:>14.1f}{s['produce_records_per_s']:>12.0f}{p50}"
              f"{p99}{s['broker_cpu_s_per_gib']:>18.2f}{_num(s['fetch_mb_per_s'], 12)}"
              f"{_num(s['consume_mb_per_s'], 14)}{s['delivery_errors']:>8}")
    print("fetch: batch reader over the wire (what the broker serves); consume: confluent-kafka consumer with a "
          "per-message Python loop (client-bound)")
    if "idempotent" in summary and "plain" in summary:
        cost = 1 - summary["idempotent"]["produce_mb_per_s"] / summary["plain"]["produce_mb_per_s"]
        cpu = summary["idempotent"]["broker_cpu_s_per_gib"] / summary["plain"]["broker_cpu_s_per_gib"] - 1
        cap = (" (librdkafka keeps one request in flight per partition when idempotent)"
               if args.client == "confluent" else "")
        print(f"idempotence: {cost * 100:.1f}% less produce throughput end to end{cap}, "
              f"{cpu * 100:+.1f}% broker CPU per GiB")
    out = Path(__file__).parent / "results" / f"produce_fetch-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"mb": args.mb, "runs": args.runs, "client": args.client, "value": args.value,
                               "summary": summary}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
