"""The log cleaner beside Apache Kafka 4.4 (issue 22): one single node of each, interleaved, median of the runs.

Three figures, the same script and clients for both:

- **cleaner MB/s**: a topic of `--mb` MiB of keyed records (`--value-bytes`, 1 KiB by default) over `--keys` keys in 1 MiB segments is written
  with cleanup.policy=delete, then switched to compact; the figure is the closed segments' bytes over the time
  until the broker's `cleaner-offset-checkpoint` (both write one, in the same format) reaches the active segment.
- **produce latency while the cleaner works**: `--rate-mb` MB/s of 1 KiB records (idempotent, acks=all, linger
  1 ms; bench/paced.py) for `--seconds`, once with nothing to clean and once with a topic of `--mb` MiB switched
  to compact 3 s into the run; p50/p99/max as librdkafka measures them, of the whole idle run and of the records
  produced while the clean ran (from the switch to the checkpoint).
- **__consumer_offsets after `--commits` offset commits**: `--groups` live groups commit 100 partitions a request
  (one record a partition) with `offsets.topic.segment.bytes` at 1 MiB; then the size of __consumer_offsets
  once cleaned, and after a restart the time until a committed offset can be fetched again (from the process
  start, and from the moment the port answers, which leaves out the JVM's and Python's own start).

Settings common to both: log.cleaner.backoff.ms=200, offsets.topic.num.partitions=4, the default dedupe buffer
(128 MiB) and one cleaner thread. oncelog fsyncs before it acknowledges, Kafka does not (its default flush).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka.protocol.consumer import OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.paced import paced_produce, percentile  # noqa: E402
from tests.support.kafka import KafkaCluster, KafkaUnavailable, java_executable, kafka_classpath  # noqa: E402
from tests.support.wire import Wire  # noqa: E402

from oncelog.embedded import BrokerProcess  # noqa: E402
from oncelog.storage.checkpoints import read_checkpoint  # noqa: E402

SEGMENT = 1 << 20
COMMON = {"log.cleaner.backoff.ms": 200, "offsets.topic.num.partitions": 4, "offsets.topic.segment.bytes": SEGMENT,
          "group.initial.rebalance.delay.ms": 0}
COMMIT_TOPIC, COMMIT_PARTITIONS = "committed", 100
RESULTS = Path(__file__).parent / "results"


class Oncelog:
    name = "oncelog"

    def __init__(self, directory: Path) -> None:
        self.proc = BrokerProcess(directory / "data", dict(COMMON)).start(60)
        self.data_dir = Path(self.proc.data_dir)

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap

    def restart(self) -> float:
        """Stop, start; seconds from the start until the port answers."""
        self.proc.stop()
        t0 = time.monotonic()
        self.proc.start(120)  # ready: it prints its port once it listens
        return time.monotonic() - t0

    def stop(self) -> None:
        self.proc.stop()


class Kafka:
    name = "kafka-4.4"

    def __init__(self, directory: Path, java: str, classpath: str) -> None:
        self.cluster = KafkaCluster(directory, 1, dict(COMMON), java=java, classpath=classpath, heap_mb=1024).start()
        self.node = self.cluster.node(1)
        self.data_dir = self.node.data_dir

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def restart(self) -> float:
        self.node.stop()
        t0 = time.monotonic()
        self.node.launch()
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.node.ports["PLAINTEXT"]), timeout=0.2).close()
                return time.monotonic() - t0
            except OSError:
                if time.monotonic() - t0 > 120:
                    raise TimeoutError("Kafka did not come back") from None
                time.sleep(0.01)

    def stop(self) -> None:
        self.cluster.stop()


# -- cleaner throughput ---------------------------------------------------------------------------------------


def write_keyed(bootstrap: str, topic: str, mb: int, keys: int, seed: int = 22, value_bytes: int = 1024) -> None:
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "batch.size": 262144,
                         "compression.type": "none", "queue.buffering.max.kbytes": 262144})
    value = bytes(rng.getrandbits(8) for _ in range(value_bytes))
    for i in range(mb * (1 << 20) // (value_bytes + 12)):
        while True:
            try:
                producer.produce(topic, value, key=b"key-%08d" % rng.randrange(keys), partition=0)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0


def create(bootstrap: str, topic: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (f,) = admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values()
    f.result(60)


def set_compact(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET)])
    (f,) = admin.incremental_alter_configs([res]).values()
    f.result(60)


def closed_segments(data_dir: Path, topic: str, partition: int = 0) -> tuple[int, int]:
    """(bytes of the closed segments, base offset of the active one)."""
    logs = sorted((data_dir / f"{topic}-{partition}").glob("*.log"))
    return sum(p.stat().st_size for p in logs[:-1]), int(logs[-1].stem)


def cleaned_past(data_dir: Path, topic: str, partition: int, offset: int) -> bool:
    try:
        return read_checkpoint(data_dir / "cleaner-offset-checkpoint").get((topic, partition), -1) >= offset
    except Exception:  # noqa: BLE001 - read while the broker replaces it
        return False


def clean_rate(system: Any, mb: int, keys: int, run: int, value_bytes: int) -> dict[str, Any]:
    topic = f"dirty-{run}"
    create(system.bootstrap, topic, **{"cleanup.policy": "delete", "segment.bytes": str(SEGMENT),
                                       "retention.ms": "-1"})
    write_keyed(system.bootstrap, topic, mb, keys, value_bytes=value_bytes)
    dirty, active = closed_segments(system.data_dir, topic)
    t0 = time.monotonic()
    set_compact(system.bootstrap, topic)
    while not cleaned_past(system.data_dir, topic, 0, active):
        if time.monotonic() - t0 > 600:
            raise TimeoutError(f"{system.name}: {topic} not cleaned in 10 minutes")
        time.sleep(0.02)
    seconds = time.monotonic() - t0
    after, _ = closed_segments(system.data_dir, topic)
    return {"dirty_mb": dirty / 1e6, "seconds": seconds, "mb_per_s": dirty / 1e6 / seconds,
            "cleaned_mb": after / 1e6}


# -- produce latency while cleaning ---------------------------------------------------------------------------


PACED = {"enable.idempotence": True, "acks": "all", "linger.ms": 1}


def latency_while_cleaning(system: Any, mb: int, keys: int, rate_mb: float, seconds: float,
                           run: int) -> dict[str, Any]:
    """p50/p99/max of the records produced while nothing is cleaned (the whole run) and of those produced while
    the clean of a `mb` MiB topic ran (from the switch to compact to the checkpoint: its own samples of a run
    that lasts `seconds`)."""
    out: dict[str, Any] = {}
    paced = f"paced-{run}"
    create(system.bootstrap, paced, 4)
    out["idle"] = paced_produce({"bootstrap.servers": system.bootstrap, **PACED}, paced, 4, rate_mb, seconds)
    topic = f"busy-{run}"
    create(system.bootstrap, topic, **{"cleanup.policy": "delete", "segment.bytes": str(SEGMENT),
                                       "retention.ms": "-1"})
    write_keyed(system.bootstrap, topic, mb, keys, seed=run)
    _dirty, active = closed_segments(system.data_dir, topic)
    window: list[float] = []

    def clean_after(delay: float) -> None:  # the clean starts a few seconds into the run, past its warm-up
        time.sleep(delay)
        window.append(time.perf_counter())
        set_compact(system.bootstrap, topic)
        while not cleaned_past(system.data_dir, topic, 0, active) and time.perf_counter() - window[0] < 600:
            time.sleep(0.01)
        window.append(time.perf_counter())
    samples: list[tuple[float, float]] = []
    cleaner = threading.Thread(target=clean_after, args=(3.0,), daemon=True)
    cleaner.start()
    out["whole_run"] = paced_produce({"bootstrap.servers": system.bootstrap, **PACED}, paced, 4, rate_mb, seconds,
                                     samples=samples)
    cleaner.join()
    during = sorted(lat for sent, lat in samples if window[0] <= sent <= window[1])
    out["clean_seconds"] = window[1] - window[0]
    out["cleaning"] = {"records": len(during), "p50_ms": percentile(during, 0.5) * 1000 if during else None,
                       "p99_ms": percentile(during, 0.99) * 1000 if during else None,
                       "max_ms": during[-1] * 1000 if during else None}
    return out


# -- __consumer_offsets -----------------------------------------------------------------------------------------


def find_coordinators(bootstrap: str, groups: int) -> None:
    """FindCoordinator for every group until each answers (Kafka creates __consumer_offsets on the first one and
    loads its partitions before it answers)."""
    with Wire(bootstrap, timeout=60) as w:
        for g in range(groups):
            deadline = time.monotonic() + 120
            while w.request(FindCoordinatorRequest[3](key=f"group-{g}", key_type=0), 3).error_code:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no coordinator for group-{g}")
                time.sleep(0.1)


def commit_many(bootstrap: str, commits: int, groups: int) -> None:
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    requests = commits // COMMIT_PARTITIONS
    find_coordinators(bootstrap, groups)
    with Wire(bootstrap, timeout=60) as w:
        for i in range(requests):
            req = OffsetCommitRequest(
                group_id=f"group-{i % groups}", generation_id_or_member_epoch=-1, member_id="",
                group_instance_id=None, retention_time_ms=-1, topics=[T(name=COMMIT_TOPIC, partitions=[
                    T.OffsetCommitRequestPartition(partition_index=p, committed_offset=i, committed_leader_epoch=-1,
                                                   committed_metadata="") for p in range(COMMIT_PARTITIONS)])])
            resp = w.request(req, 7)
            bad = [p.error_code for t in resp.topics for p in t.partitions if p.error_code]
            if bad:
                raise RuntimeError(f"OffsetCommit failed: {bad[:3]}")


def fetch_offset(bootstrap: str, group: str) -> int | None:
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    try:
        with Wire(bootstrap, timeout=10) as w:
            resp = w.request(OffsetFetchRequest(group_id=group, topics=[T(name=COMMIT_TOPIC, partition_indexes=[0])],
                                                require_stable=False), 7)
    except OSError:
        return None
    if resp.error_code:
        return None
    (p,) = [p for t in resp.topics for p in t.partitions]
    return p.committed_offset if p.error_code == 0 else None


def offsets_topic(system: Any, commits: int, groups: int) -> dict[str, Any]:
    create(system.bootstrap, COMMIT_TOPIC, COMMIT_PARTITIONS)
    t0 = time.monotonic()
    commit_many(system.bootstrap, commits, groups)
    commit_s = time.monotonic() - t0
    last = commits // COMMIT_PARTITIONS - 1
    expected = last - (last % groups)  # group-0's last commit

    def size() -> int:
        return sum(p.stat().st_size for p in system.data_dir.glob("__consumer_offsets-*/*.log"))

    def records_left() -> int:
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": system.bootstrap, "group.id": "bench-reader",
                             "enable.auto.commit": False, "enable.partition.eof": True})
        parts = sorted(int(p.name.rsplit("-", 1)[1]) for p in system.data_dir.glob("__consumer_offsets-*"))
        consumer.assign([TopicPartition("__consumer_offsets", p, 0) for p in parts])
        left, pending, deadline = 0, set(parts), time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                pending.discard(msg.partition())
            else:
                left += 1
        consumer.close()
        return left

    def settled() -> bool:
        for part in system.data_dir.glob("__consumer_offsets-*"):
            index = int(part.name.rsplit("-", 1)[1])
            closed, active = closed_segments(system.data_dir, "__consumer_offsets", index)
            if closed and not cleaned_past(system.data_dir, "__consumer_offsets", index, active):
                return False
        return True
    t1 = time.monotonic()
    while not settled() and time.monotonic() - t1 < 600:
        time.sleep(0.2)
    cleaned = size()
    left = records_left()
    t2 = time.monotonic()
    port_s = system.restart()
    t_port = time.monotonic()
    while fetch_offset(system.bootstrap, "group-0") != expected:
        if time.monotonic() - t2 > 300:
            raise TimeoutError(f"{system.name}: group-0's offset {expected} not readable after the restart")
        time.sleep(0.01)
    done = time.monotonic()
    return {"commits": commits, "commit_s": commit_s, "records_left": left, "cleaned_mb": cleaned / 1e6,
            "restart_to_offsets_s": done - t2, "port_to_offsets_s": done - t_port, "port_s": port_s}


# -- main -----------------------------------------------------------------------------------------------------------


def one_run(kind: str, run: int, args: argparse.Namespace, java: str | None, classpath: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-cleaner-{kind}-") as tmp:
        system = Oncelog(Path(tmp)) if kind == "oncelog" else Kafka(Path(tmp), java, classpath)
        try:
            out: dict[str, Any] = {}
            if "rate" in args.measure:
                out["clean"] = clean_rate(system, args.mb, args.keys, run, args.value_bytes)
            if "latency" in args.measure:
                out["latency"] = latency_while_cleaning(system, args.mb, args.keys, args.rate_mb, args.seconds, run)
            if "offsets" in args.measure:
                out["offsets"] = offsets_topic(system, args.commits, args.groups)
            return out
        finally:
            system.stop()


def median(runs: list[dict], *path: str) -> float | None:
    values = []
    for r in runs:
        v: Any = r
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            values.append(float(v))
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mb", type=int, default=256, help="MiB of keyed records to clean")
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--value-bytes", type=int, default=1024, help="value size of the records to clean")
    parser.add_argument("--rate-mb", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--systems", default="oncelog,kafka")
    parser.add_argument("--measure", default="rate,latency,offsets")
    args = parser.parse_args()
    java = classpath = None
    systems = args.systems.split(",")
    if "kafka" in systems:
        try:
            java, classpath = java_executable(), kafka_classpath()
        except KafkaUnavailable as exc:
            print(f"Kafka left out: {exc}")
            systems.remove("kafka")
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for run in range(args.runs):
        for kind in systems:  # interleaved
            r = one_run(kind, run, args, java, classpath)
            print(f"run {run + 1} {kind}: {json.dumps(r)}", flush=True)
            results[kind].append(r)
    rows = [
        ("cleaner MB/s", ("clean", "mb_per_s")), ("dirty MB", ("clean", "dirty_mb")),
        ("cleaned MB", ("clean", "cleaned_mb")),
        ("p50 ms idle", ("latency", "idle", "p50_ms")), ("p99 ms idle", ("latency", "idle", "p99_ms")),
        ("max ms idle", ("latency", "idle", "max_ms")),
        ("p50 ms cleaning", ("latency", "cleaning", "p50_ms")), ("p99 ms cleaning", ("latency", "cleaning", "p99_ms")),
        ("max ms cleaning", ("latency", "cleaning", "max_ms")), ("records while cleaning", ("latency", "cleaning", "records")),
        ("clean s (latency run)", ("latency", "clean_seconds")),
        ("commits/s", None), ("__consumer_offsets records left", ("offsets", "records_left")),
        ("__consumer_offsets cleaned MB", ("offsets", "cleaned_mb")),
        ("restart -> offsets s", ("offsets", "restart_to_offsets_s")),
        ("port -> offsets s", ("offsets", "port_to_offsets_s")),
    ]
    print(f"\nmedian of {args.runs} (interleaved); --mb {args.mb} --keys {args.keys} --value-bytes {args.value_bytes} --rate-mb {args.rate_mb} "
          f"--seconds {args.seconds} --commits {args.commits} --groups {args.groups}")
    print(f"{'':34}" + "".join(f"{s:>14}" for s in systems))
    for label, path in rows:
        if path is None:
            vals = [args.commits / m if (m := median(results[s], "offsets", "commit_s")) else None for s in systems]
        else:
            vals = [median(results[s], *path) for s in systems]
        if all(v is None for v in vals):
            continue
        print(f"{label:34}" + "".join(f"{v:>14.2f}" if v is not None else f"{'-':>14}" for v in vals))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cleaner-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
