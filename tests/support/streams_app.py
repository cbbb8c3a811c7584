"""The Kafka Streams exactly_once_v2 program of tests/interop/streams, driven from Python (tests and bench).

`build_jar()` builds `tests/interop/streams` once (`mvn -q -B package`: Kafka Streams 4.4 and its client from
Maven Central into ~/.m2 the first time, offline afterwards) and raises StreamsUnavailable when that cannot
happen here (no java or mvn, Central unreachable with nothing in ~/.m2), a reason to skip.

`StreamsInstance` runs one instance of the program (oncelog.streams.EosAggregation, one JVM): it reads the JSON
lines the program prints (state changes, uncaught exceptions, restores) on a thread and lets the caller wait for
a state, SIGKILL the JVM, or SIGTERM it and wait for its clean close.

The data: input record `i` (ids from 1) goes to input partition `i % partitions` with the value
`"<group>,<i>"`; the program re-keys it by group (a repartition topic) and keeps per group `"<count>,<sum>"` in a
store with a compacted changelog, every update going to the output topic. `check_exactly_once` compares what a
read_committed reader got from the output with the ids that were committed to the input.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from oncelog.cluster.coordination_service import orphan_guard

STREAMS_DIR = Path(__file__).resolve().parents[1] / "interop" / "streams"
JAR = STREAMS_DIR / "target" / "oncelog-streams-eos.jar"
KAFKA_STREAMS_VERSION = "4.4.0"     # pinned in tests/interop/streams/pom.xml
BUILD_TIMEOUT_S = 900.0
# Cheap JIT and a small serial heap for tests on 2 shared cores; the benchmark runs the JVM's defaults.
TEST_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx256m")
LOG_FLAGS = ("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dorg.slf4j.simpleLogger.showDateTime=true")

# What Maven prints when it cannot reach a repository: a skip, not a failure.
_OFFLINE = re.compile(
    r"Could not transfer|Unknown ?host|UnknownHostException|Network is unreachable|Connection refused|"
    r"Connect(ion)? timed out|Read timed out|No route to host|Temporary failure in name resolution|"
    r"offline mode|has not been downloaded from it before|Cannot access central|PKIX path",
    re.IGNORECASE,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class StreamsUnavailable(Exception):
    """Kafka Streams cannot run here (no java/mvn, old JDK, Maven Central unreachable): a reason to skip."""


def _jar_up_to_date() -> bool:
    if not JAR.is_file():
        return False
    built = JAR.stat().st_mtime
    inputs = [STREAMS_DIR / "pom.xml", *(STREAMS_DIR / "src").rglob("*")]
    return all(f.stat().st_mtime < built for f in inputs if f.is_file())


def build_jar(timeout: float = BUILD_TIMEOUT_S) -> Path:
    """The program's jar, built if it is missing or older than its sources."""
    if shutil.which("java") is None:
        raise StreamsUnavailable("Kafka Streams: no `java` on PATH (a JDK 17+ is needed)")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StreamsUnavailable("Kafka Streams: no `mvn` on PATH (Maven 3.8+ builds tests/interop/streams)")
    if _jar_up_to_date():
        return JAR
    try:
        proc = subprocess.run([mvn, "-q", "-B", "-Dstyle.color=never", "package"], cwd=STREAMS_DIR,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise StreamsUnavailable(f"Kafka Streams: `mvn package` did not finish in {timeout:.0f} s "
                                 "(Maven Central unreachable or very slow?)") from exc
    output = _ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        if _OFFLINE.search(output):
            first = next((ln for ln in output.splitlines() if _OFFLINE.search(ln)), "")
            raise StreamsUnavailable(f"Kafka Streams: Maven could not resolve kafka-streams {KAFKA_STREAMS_VERSION} "
                                     f"(Maven Central unreachable and nothing in ~/.m2): {first.strip()[:300]}")
        if re.search(r"release version \d+ not supported|invalid target release", output):
            raise StreamsUnavailable(f"Kafka Streams: the JDK Maven uses is older than 17: {output.strip()[-300:]}")
        raise RuntimeError(f"`mvn package` in {STREAMS_DIR} failed (exit {proc.returncode}):\n{output[-6000:]}")
    if not JAR.is_file():
        raise RuntimeError(f"`mvn package` succeeded but {JAR} is missing")
    return JAR


def repartition_topic(application_id: str) -> str:
    return f"{application_id}-by-group-repartition"


def changelog_topic(application_id: str) -> str:
    return f"{application_id}-totals-changelog"


class StreamsInstance:
    """One instance of the program (a JVM of its own). `events` holds every JSON line it printed, in order."""

    def __init__(self, name: str, bootstrap: str, application_id: str, state_dir: Path, log_dir: Path, *,
                 input_topic: str, output_topic: str, commit_interval_ms: int = 150, replication: int = 1,
                 config: Mapping[str, object] | None = None, jvm_flags: Sequence[str] = TEST_JVM_FLAGS,
                 jar: Path = JAR) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.application_id = application_id
        self.state_dir = Path(state_dir)
        self.log_dir = Path(log_dir)
        self.input_topic = input_topic
        self.output_topic = output_topic
        self.commit_interval_ms = commit_interval_ms
        self.replication = replication
        self.config = dict(config or {})
        self.jvm_flags = list(jvm_flags)
        self.jar = jar
        self.proc: subprocess.Popen | None = None
        self.events: list[dict[str, str]] = []
        self.runs = 0                    # processes started so far; each run's stderr goes to its own file
        self.exit_codes: list[int] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    # -- process -------------------------------------------------------------------------------------------

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.name}-{self.runs}.stderr"

    def start(self) -> StreamsInstance:
        if self.alive():
            raise RuntimeError(f"streams instance {self.name} already runs (pid {self.proc.pid})")
        self.runs += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        args = [*orphan_guard(), "java", *self.jvm_flags, *LOG_FLAGS, "-jar", str(self.jar),
                "--bootstrap", self.bootstrap, "--application-id", self.application_id,
                "--state-dir", str(self.state_dir), "--input", self.input_topic, "--output", self.output_topic,
                "--commit-interval-ms", str(self.commit_interval_ms), "--replication", str(self.replication)]
        for key, value in self.config.items():
            args += ["--config", f"{key}={value}"]
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                         text=True, bufsize=1)
        with self._cond:
            self.events.append({"event": "process_started", "run": str(self.runs), "pid": str(self.proc.pid)})
        self._reader = threading.Thread(target=self._read, args=(self.proc,), name=f"streams-{self.name}",
                                        daemon=True)
        self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "unparsed", "line": line}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        code = proc.wait()
        with self._cond:
            self.events.append({"event": "process_exited", "code": str(code)})
            self._cond.notify_all()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def kill(self) -> None:
        """SIGKILL the JVM (by its pid): no close, no commit, no checkpoint."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self._reap()

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM and wait: the program closes Kafka Streams (commits, writes checkpoints) and exits; its code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self._reap()

    def _reap(self) -> int:
        assert self.proc is not None
        code = self.proc.wait()
        if self._reader is not None:
            self._reader.join(10)
        self.exit_codes.append(code)
        self.proc = None
        return code

    def wipe_state(self) -> None:
        """Remove the state directory (only while the process is down): the next start restores every store
        from its changelog."""
        assert not self.alive(), "wipe the state of a stopped instance only"
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # -- what it printed -----------------------------------------------------------------------------------

    def mark(self) -> int:
        """An index into `events`: wait_state(since=mark()) only looks at what comes after it."""
        with self._cond:
            return len(self.events)

    def state(self) -> str | None:
        with self._cond:
            states = [e["new"] for e in self.events if e["event"] == "state"]
        return states[-1] if states else None

    def select(self, kind: str, since: int = 0) -> list[dict[str, str]]:
        with self._cond:
            return [e for e in self.events[since:] if e["event"] == kind]

    def wait_state(self, state: str, timeout: float, since: int = 0) -> None:
        """Until the program reports `state` (after index `since` of `events`) and is in it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                seen = [e["new"] for e in self.events[since:] if e["event"] == "state"]
                if seen and seen[-1] == state:
                    return
                if any(e["event"] in ("uncaught", "process_exited") for e in self.events[since:]):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
        raise AssertionError(f"streams instance {self.name} not {state} after {timeout:.0f} s; states since: "
                             f"{seen}\n{self.describe()}")

    def restores(self, since: int = 0) -> list[dict[str, Any]]:
        """Each finished restore after index `since`: topic, partition, start and end offset, records restored."""
        with self._cond:
            events = self.events[since:]
        started: dict[tuple[str, str], dict[str, str]] = {}
        out = []
        for e in events:
            key = (e.get("topic", ""), e.get("partition", ""))
            if e["event"] == "restore_start":
                started[key] = e
            elif e["event"] == "restore_end" and key in started:
                s = started.pop(key)
                out.append({"topic": key[0], "partition": int(key[1]), "start": int(s["start_offset"]),
                            "end": int(s["end_offset"]), "restored": int(e["restored"])})
        return out

    def fatal(self) -> list[dict[str, str]]:
        """Uncaught exceptions, and a state of ERROR or PENDING_ERROR, over every run."""
        with self._cond:
            return [e for e in self.events if e["event"] == "uncaught"
                    or (e["event"] == "state" and e["new"] in ("ERROR", "PENDING_ERROR"))]

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def describe(self) -> str:
        with self._cond:
            recent = self.events[-25:]
        return (f"-- {self.name}: last events --\n" + "\n".join(json.dumps(e) for e in recent)
                + f"\n-- {self.name}: stderr tail ({self.stderr_path.name}) --\n{self.stderr_tail()}")


# -- the data ------------------------------------------------------------------------------------------------


def group_of(record_id: int, groups: int) -> str:
    """The group of input record `record_id`: spread over groups independently of the input partition."""
    return f"g{(record_id * 7919) % groups:02d}"


def input_value(record_id: int, groups: int) -> bytes:
    return f"{group_of(record_id, groups)},{record_id}".encode()


def _transactional_producer(bootstrap: str, transactional_id: str, timeout: float) -> Any:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                         "transaction.timeout.ms": 60000, "reconnect.backoff.max.ms": 1000})
    _retry(lambda: producer.init_transactions(timeout), timeout)
    return producer


def _retry(call: Any, timeout: float) -> None:
    """`call` again while librdkafka calls its error retriable (a broker restarting), up to `timeout`."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        try:
            call()
            return
        except KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _commit_or_abort(producer: Any, timeout: float) -> bool:
    """Commit the open transaction; True once committed, False when librdkafka says it must be aborted (then it
    is). Retriable errors are retried as librdkafka's API asks; anything else (fatal) raises."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        try:
            producer.commit_transaction(max(deadline - time.monotonic(), 1.0))
            return True
        except KafkaException as exc:
            err = exc.args[0]
            if err.txn_requires_abort():
                _retry(lambda: producer.abort_transaction(timeout), timeout)
                return False
            if not err.retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class InputWave(threading.Thread):
    """Input records `ids` produced in the background by a transactional librdkafka producer, `per_transaction`
    records a transaction with `pause` seconds between transactions. Every `abort_every`-th transaction is
    aborted on purpose; one that librdkafka says must be aborted (a broker killed under it) is aborted too.
    Afterwards `committed` and `aborted` hold the ids of each kind, `error` what stopped it if anything."""

    def __init__(self, bootstrap: str, topic: str, ids: Iterable[int], *, partitions: int, groups: int,
                 transactional_id: str, per_transaction: int = 100, pause: float = 0.05, abort_every: int = 0,
                 timeout: float = 180.0) -> None:
        super().__init__(name=f"input-{transactional_id}", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.ids = list(ids)
        self.partitions = partitions
        self.groups = groups
        self.transactional_id = transactional_id
        self.per_transaction = per_transaction
        self.pause = pause
        self.abort_every = abort_every
        self.timeout = timeout
        self.committed: list[int] = []
        self.aborted: list[int] = []
        self.forced_aborts = 0           # transactions librdkafka had to abort
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc

    def _produce(self) -> None:
        producer = _transactional_producer(self.bootstrap, self.transactional_id, self.timeout)
        for n, start in enumerate(range(0, len(self.ids), self.per_transaction), start=1):
            chunk = self.ids[start:start + self.per_transaction]
            producer.begin_transaction()
            for record_id in chunk:
                while True:
                    try:
                        producer.produce(self.topic, key=b"id-%d" % record_id,
                                         value=input_value(record_id, self.groups),
                                         partition=record_id % self.partitions)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            if self.abort_every and n % self.abort_every == 0:
                producer.flush(self.timeout)
                _retry(lambda: producer.abort_transaction(self.timeout), self.timeout)
                committed = False
            else:
                committed = _commit_or_abort(producer, self.timeout)
                self.forced_aborts += not committed
            with self._lock:
                (self.committed if committed else self.aborted).extend(chunk)
            time.sleep(self.pause)

    def progress(self) -> int:
        """Transactions ended so far (committed or aborted), in records."""
        with self._lock:
            return len(self.committed) + len(self.aborted)

    def finish(self, timeout: float = 300.0) -> InputWave:
        self.join(timeout)
        assert not self.is_alive(), f"input wave {self.transactional_id} not produced in {timeout:.0f} s"
        assert self.error is None, f"input wave {self.transactional_id} failed: {self.error!r}"
        return self


def expected_totals(ids: Iterable[int], groups: int) -> dict[str, list[int]]:
    """{group: its committed input ids, ascending}."""
    out: dict[str, list[int]] = defaultdict(list)
    for record_id in sorted(ids):
        out[group_of(record_id, groups)].append(record_id)
    return dict(out)


def read_output(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0,
                isolation: str = "read_committed") -> dict[str, list[tuple[int, int]]]:
    """Every record of the output topic from offset 0 to its end, as {group: [(count, sum), ...]} in offset
    order (a group's updates are all in one partition, keyed by the group)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "streams-output-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "error", "isolation.level": isolation})
    updates: dict[str, list[tuple[int, int]]] = defaultdict(list)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        pending = set(range(partitions))
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: partitions {sorted(pending)} not read to the end in {timeout:.0f} s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise AssertionError(f"{topic}: consumer error {msg.error()}")
            count, total = msg.value().decode().split(",")
            updates[msg.key().decode()].append((int(count), int(total)))
    finally:
        consumer.close()
    return dict(updates)


def check_exactly_once(expected: Mapping[str, list[int]], updates: Mapping[str, list[tuple[int, int]]],
                       partitions: int) -> list[str]:
    """What in the output breaks exactly-once, as readable lines (empty: nothing).

    Per group, the updates must be the counts 1, 2, ..., N in this order (each step once: a record processed
    twice, or a store restored to an older value, repeats a count), and the sum must grow at each step by the id
    of one input record of that group, every committed input id exactly once (an aborted input record, or a
    lost one replaced by a duplicate, changes that multiset), in each input partition's order; the last update
    is the group's exact count and sum."""
    problems = []
    for group in sorted(set(expected) | set(updates)):
        want = expected.get(group, [])
        got = updates.get(group, [])
        counts = [c for c, _ in got]
        if counts != list(range(1, len(want) + 1)):
            repeated = sorted({c for c in counts if counts.count(c) > 1})
            problems.append(f"{group}: {len(got)} updates for {len(want)} input records; counts are not 1..{len(want)} "
                            f"in order (repeated: {repeated[:10]}, first: {counts[:8]}, last: {counts[-8:]})")
            continue
        steps = [s - prev for (_, s), prev in zip(got, [0] + [s for _, s in got[:-1]], strict=True)]
        if sorted(steps) != want:
            extra = sorted(set(steps) - set(want))[:10]
            missing = sorted(set(want) - set(steps))[:10]
            problems.append(f"{group}: the sums' steps are not its input ids once each (foreign or repeated: {extra}, "
                            f"missing: {missing})")
            continue
        for p in range(partitions):
            from_p = [i for i in steps if i % partitions == p]
            if from_p != sorted(from_p):
                problems.append(f"{group}: records of input partition {p} were aggregated out of order")
        if got[-1] != (len(want), sum(want)):
            problems.append(f"{group}: final total {got[-1]} != ({len(want)}, {sum(want)})")
    return problems


def progress(updates: Mapping[str, list[tuple[int, int]]]) -> int:
    """Input records the output accounts for so far: the sum of every group's last count."""
    return sum(u[-1][0] for u in updates.values() if u)


def wait_for_output(bootstrap: str, topic: str, partitions: int, total: int, timeout: float,
                    instances: Sequence[StreamsInstance] = ()) -> dict[str, list[tuple[int, int]]]:
    """Read the output until its last counts account for `total` input records (or fail with where it got)."""
    deadline = time.monotonic() + timeout
    done = 0
    while True:
        updates = read_output(bootstrap, topic, partitions)
        done = progress(updates)
        if done >= total:
            return updates
        for inst in instances:
            assert not inst.fatal(), f"streams instance {inst.name} failed:\n{inst.describe()}"
        if time.monotonic() > deadline:
            raise AssertionError(f"output accounts for {done} of {total} input records after {timeout:.0f} s\n"
                                 + "\n".join(i.describe() for i in instances))
        time.sleep(1.0)


def events_summary(instances: Sequence[StreamsInstance]) -> dict[str, Any]:
    """Per instance: its state changes and restores, for a test's report."""
    return {i.name: {"states": [e["new"] for e in i.select("state")],
                     "restored": [(r["partition"], r["start"], r["end"], r["restored"]) for r in i.restores()]}
            for i in instances}


# -- what the brokers hold -----------------------------------------------------------------------------------


def offsets(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> dict[int, tuple[int, int]]:
    """{partition: (log start offset, high watermark)} (ListOffsets earliest and latest)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "streams-offsets-reader"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                for p in range(partitions)}
    finally:
        consumer.close()


def records_from_start(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> dict[int, int]:
    """{partition: data records a read_committed reader gets from the log start to the end}."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "streams-log-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    counts = dict.fromkeys(range(partitions), 0)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        pending = set(range(partitions))
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: partitions {sorted(pending)} not read to the end in {timeout:.0f} s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise AssertionError(f"{topic}: consumer error {msg.error()}")
            counts[msg.partition()] += 1
    finally:
        consumer.close()
    return counts


def tracebacks(log_path: Path) -> list[str]:
    """Lines of a broker log that start a Python traceback, with the line before each (what was logged)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [f"{lines[i - 1] if i else ''} | {line}" for i, line in enumerate(lines) if line.startswith("Traceback")]


# -- one run: topics, two instances, input waves ---------------------------------------------------------------


class EosRun:
    """The parts of a test run: the input and output topics (created here), instances a and b of the program
    under one application id, and the input waves produced so far (ids never reused)."""

    def __init__(self, bootstrap: str, workdir: Path, jar: Path, *, partitions: int, groups: int,
                 topic_config: Mapping[str, str], streams_config: Mapping[str, object], replication: int = 1,
                 instances: int = 2) -> None:
        from tests.integration.helpers import create_topic

        self.bootstrap = bootstrap
        self.partitions = partitions
        self.groups = groups
        self.app = f"eos-{os.urandom(4).hex()}"
        self.source, self.sink = f"{self.app}-input", f"{self.app}-output"
        for topic in (self.source, self.sink):
            create_topic(bootstrap, topic, partitions, config=dict(topic_config), replication_factor=replication)
        names = [chr(ord("a") + n) for n in range(instances)]
        self.instances = [StreamsInstance(name, bootstrap, self.app, workdir / f"state-{name}",
                                          workdir / "streams-logs", input_topic=self.source, output_topic=self.sink,
                                          replication=replication, config=streams_config, jar=jar)
                          for name in names]
        self.waves: list[InputWave] = []
        self._next_id = 1

    @property
    def changelog(self) -> str:
        return changelog_topic(self.app)

    @property
    def repartition(self) -> str:
        return repartition_topic(self.app)

    def start_all(self, timeout: float) -> None:
        for inst in self.instances:
            inst.start()
        for inst in self.instances:
            inst.wait_state("RUNNING", timeout)

    def wave(self, count: int, **kwargs: Any) -> InputWave:
        """Start producing the next `count` ids (InputWave keyword arguments: pacing, aborts)."""
        first = self._next_id
        self._next_id += count
        w = InputWave(self.bootstrap, self.source, range(first, first + count), partitions=self.partitions,
                      groups=self.groups, transactional_id=f"{self.app}-source-{len(self.waves)}", **kwargs)
        self.waves.append(w)
        w.start()
        return w

    def committed(self) -> list[int]:
        return [i for w in self.waves for i in w.committed]

    def aborted(self) -> list[int]:
        return [i for w in self.waves for i in w.aborted]

    def drain(self, timeout: float) -> dict[str, list[tuple[int, int]]]:
        """Until the output accounts for every committed input record."""
        return wait_for_output(self.bootstrap, self.sink, self.partitions, len(self.committed()), timeout,
                               self.instances)

    def changelog_records(self) -> int:
        return sum(records_from_start(self.bootstrap, self.changelog, self.partitions).values())

    def restores_since(self, marks: Mapping[str, int]) -> list[dict[str, Any]]:
        """Changelog restores each instance finished after its mark."""
        return [r for inst in self.instances for r in inst.restores(marks.get(inst.name, 0))
                if r["topic"] == self.changelog]

    def marks(self) -> dict[str, int]:
        return {inst.name: inst.mark() for inst in self.instances}

    def describe(self) -> str:
        return "\n".join(inst.describe() for inst in self.instances)

    def stop_all(self) -> None:
        """SIGTERM each instance; each must report a clean close and exit with 0."""
        for inst in self.instances:
            code = inst.stop()
            closed = inst.select("closed")
            assert code == 0 and closed and closed[-1]["clean"] == "true", \
                f"{inst.name} did not close cleanly (exit {code})\n{inst.describe()}"

    def kill_all(self) -> None:
        for inst in self.instances:
            inst.kill()


def read_cleaned(restores: Sequence[Mapping[str, Any]], span: int = 200) -> list[Mapping[str, Any]]:
    """The restores that read a cleaned changelog: over at least `span` offsets, fewer records than half of them
    (an uncleaned changelog of this program holds a record at all but its transaction markers' offsets)."""
    return [r for r in restores if r["end"] - r["start"] >= span and r["restored"] < (r["end"] - r["start"]) / 2]
