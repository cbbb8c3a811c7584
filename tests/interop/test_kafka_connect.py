"""Kafka Connect in distributed mode on a real oncelog broker (issue 22's proof: Connect's config, offset and
status topics are compacted, and the log cleaner works on them while Connect runs).

`tests/interop/connect/pom.xml` names Kafka Connect's jars (worker runtime, FileStream connectors, JsonConverter,
a log4j2 binding); their classpath is resolved by Maven once and cached (tests/support/kafka.py
`kafka_classpath`), and each worker is Connect's own main class, `ConnectDistributed`, in a JVM of its own: no
Java code of ours. Without `java` or `mvn`, or when Maven Central cannot be reached the first time, the tests are
skipped with the reason.

The broker cleans hard (segments roll each second, a cleaner pass every 200 ms, any dirty share cleaned). A
FileStreamSource connector, created through the REST API, reads a file into a topic and a FileStreamSink
connector writes that topic to another file; lines are appended to the input in waves.

What is guaranteed, and so what is asserted: FileStream connectors are at-least-once. After a crash (SIGKILL)
Connect delivers again what came after the last committed offsets, so lines may repeat, but none may be lost or
overtake a line written before it (one data partition). After a graceful stop (SIGTERM) both sides have
committed their offsets (the source's file position in the offsets topic, the sink's consumer offsets), so the
round trip through a graceful restart is exact: every line once, in order.

test_connect_distributed_round_trip_restart_on_compacted_topics (graceful stops only; exact):
- waves round-trip exactly; the sink is paused and resumed three times, which rewrites the same keys of the
  config topic (the connector's target state) and of the status topic;
- the three internal topics have `cleanup.policy=compact` (DescribeConfigs; Connect also checks it at start and
  refuses a topic that is not compacted) and Connect's partition counts;
- the cleaner has run on each of them: fewer records are read from offset 0 than were written, the log start is
  still 0 (nothing deleted as retention would), and the newest record of every key is still there at its offset
  (the cleaner's rule, seen through Connect's own records);
- the worker stops on SIGTERM ("Kafka Connect stopped" logged) and the source's stored position is then the
  input file's size;
- a new worker process, on the cleaned topics, runs both connectors again without a REST call (read back from
  the config topic); more waves round-trip; the data topic holds every line exactly once and the output file
  is exactly the input;
- no ERROR in either worker log, no WARN naming one of the topics; no traceback or ERROR in the broker log.

test_connect_through_sigkill_of_worker_and_broker (at-least-once):
- the worker is SIGKILLed while a big wave is on its way and a new one takes over; then the broker is SIGKILLed
  and restarted on its port while the next wave is on its way. After each, every input line reaches the data
  topic and the output file, in order once repeats are dropped (the output may hold one torn line per killed
  worker: the sink writes a line and its newline in two writes);
- the cleaner runs on the recovered offsets topic; a graceful stop stores the position at the file's end, and a
  third worker, started on what the crashes left, runs both connectors again and round-trips a wave exactly;
- the broker log has no traceback or ERROR; the worker that lived through the broker's death may only log, at
  ERROR, the sink offset commits that failed while no broker was up (Connect commits again later, and the
  exact wave after the graceful restart shows that it did); the third worker's log is clean.

Every JVM started here is killed by its pid at the end, on failure too, and dies with the interpreter if that is
killed (setpriv --pdeathsig).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType
from tests.integration.helpers import admin, create_topic, wait_until
from tests.support.kafka import KafkaUnavailable, java_executable, kafka_classpath

from oncelog.cluster.coordination_service import orphan_guard

CONNECT_POM = Path(__file__).parent / "connect" / "pom.xml"
CONNECT_VERSION = "4.3.1"   # pinned in connect/pom.xml, which says why not 4.4.0
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectDistributed"
SOURCE_CLASS = "org.apache.kafka.connect.file.FileStreamSourceConnector"
SINK_CLASS = "org.apache.kafka.connect.file.FileStreamSinkConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"

CONFIG_TOPIC, OFFSET_TOPIC, STATUS_TOPIC = "connect-configs", "connect-offsets", "connect-status"
INTERNAL_TOPICS = (CONFIG_TOPIC, OFFSET_TOPIC, STATUS_TOPIC)
# Connect's defaults: the config topic must have one partition; offsets 25, status 5.
INTERNAL_PARTITIONS = {CONFIG_TOPIC: 1, OFFSET_TOPIC: 25, STATUS_TOPIC: 5}
DATA_TOPIC = "connect-data"
SOURCE, SINK = "file-source", "file-sink"

# The cleaner as hard as Kafka's limits allow: segment.bytes at Kafka's minimum (1 MiB), segments rolled by age
# each second (on the next append, as in Kafka), a pass every 200 ms, any dirty share cleaned. The group
# coordinator does not hold back the first join (3 s by default), and __consumer_offsets has 5 partitions
# instead of 50 (less for the cleaner to look at).
BROKER = {"log.segment.bytes": 1 << 20, "log.roll.ms": 1000, "log.cleaner.backoff.ms": 200,
          "log.cleaner.min.cleanable.ratio": 0.01, "group.initial.rebalance.delay.ms": 0,
          "offsets.topic.num.partitions": 5}

# Two shared cores: a JVM start, a rebalance or a task's stop can take many times what it takes alone. These
# bound what a hang costs, not what a working run takes.
WORKER_START_TIMEOUT_S = 180.0
WORKER_STOP_TIMEOUT_S = 120.0
CONNECTOR_TIMEOUT_S = 120.0
ROUND_TRIP_TIMEOUT_S = 90.0
CLEAN_TIMEOUT_S = 120.0
PORT_ATTEMPTS = 3
JVM_FLAGS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")

_LOG4J2 = """\
# INFO and up to a file of this worker's own; no log4j shutdown hook, so the lines Connect logs while it stops
# (its own shutdown hook) are written too.
status = error
name = oncelog-connect-test
shutdownHook = disable
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
"""
_BIND_FAILURE = re.compile(r"BindException|Address already in use|Failed to bind")
_LOG_LINE = re.compile(r"^\[[^\]]+\] (ERROR|WARN|INFO|DEBUG|TRACE|FATAL) ")
# Loopback only: no proxy from the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="session")
def connect_runtime() -> tuple[str, str]:
    """(java, Connect's classpath), or a skip with the reason."""
    try:
        return java_executable(), kafka_classpath(pom=CONNECT_POM, artifact="connect-runtime",
                                                  version=CONNECT_VERSION)
    except KafkaUnavailable as exc:
        pytest.skip(f"Kafka Connect: {exc}")


# -- a worker -------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ConnectWorker:
    """One `ConnectDistributed` JVM: its properties, log4j2 file and log under `directory`, its REST port.

    A restart is a new ConnectWorker on the same bootstrap and group (a new process reading the topics), with a
    log of its own."""

    def __init__(self, directory: Path, name: str, runtime: tuple[str, str], bootstrap: str) -> None:
        self.directory = directory
        self.name = name
        self.java, self.classpath = runtime
        self.bootstrap = bootstrap
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = directory / f"{name}.log"
        self.out_path = directory / f"{name}.out"

    # lifecycle

    def properties(self) -> str:
        settings = {
            "bootstrap.servers": self.bootstrap,
            "group.id": "oncelog-connect",
            "config.storage.topic": CONFIG_TOPIC,
            "offset.storage.topic": OFFSET_TOPIC,
            "status.storage.topic": STATUS_TOPIC,
            "config.storage.replication.factor": 1,
            "offset.storage.replication.factor": 1,
            "status.storage.replication.factor": 1,
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
            "listeners": f"http://127.0.0.1:{self.port}",
            # The connectors are on the classpath; their ServiceLoader manifests are all Connect needs to read.
            "plugin.discovery": "service_load",
            # Offsets committed often (many updates of the same keys for the cleaner), and time enough for a
            # commit, a task's graceful stop, a sync with the config topic and a rebalance on a loaded machine.
            "offset.flush.interval.ms": 250,
            "offset.flush.timeout.ms": 60000,
            "task.shutdown.graceful.timeout.ms": 60000,
            "worker.sync.timeout.ms": 30000,
            "session.timeout.ms": 15000,
            "consumer.session.timeout.ms": 15000,
            "rebalance.timeout.ms": 120000,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def start(self) -> ConnectWorker:
        """Launch and wait until the REST API lists connectors (the worker has joined its group and read the
        config topic). A REST port taken between pick and bind is picked again."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = _free_port()
            self._launch()
            try:
                self._wait_ready()
                return self
            except AssertionError:
                died = self.proc is not None and self.proc.poll() is not None
                self.kill()
                if died and attempt < PORT_ATTEMPTS and _BIND_FAILURE.search(self.log_text()):
                    continue
                raise
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        props = self.directory / f"{self.name}.properties"
        props.write_text(self.properties())
        log4j = self.directory / f"{self.name}-log4j2.properties"
        log4j.write_text(_LOG4J2.format(path=self.log_path))
        self.log_path.unlink(missing_ok=True)
        args = [*orphan_guard(), self.java, *JVM_FLAGS, f"-Dlog4j2.configurationFile={log4j}",
                "-cp", self.classpath, MAIN_CLASS, str(props)]
        with open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        last: Any = None
        while time.monotonic() < deadline:
            self._check_alive("while starting")
            status, body = self.rest("GET", "/connectors", timeout=10)
            if status == 200 and isinstance(body, list):
                return
            last = (status, body)
            time.sleep(0.5)
        raise AssertionError(f"{self.name} did not answer GET /connectors in {WORKER_START_TIMEOUT_S:.0f} s "
                             f"(last: {last!r})\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _check_alive(self, doing: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {doing} (status {self.proc.returncode}):\n{self.log_tail()}")

    def stop(self) -> int:
        """SIGTERM (Connect's graceful stop) and wait for the exit; the JVM's exit status."""
        assert self.proc is not None and self.alive(), f"{self.name} is not running"
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not stop within {WORKER_STOP_TIMEOUT_S:.0f} s of SIGTERM "
                                 f"(killed):\n{self.log_tail()}") from None

    def kill(self) -> None:
        """SIGKILL the JVM by its pid, if it still runs, and reap it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    # logs

    def log_text(self) -> str:
        parts = []
        for path in (self.log_path, self.out_path):
            try:
                parts.append(path.read_text(errors="replace"))
            except OSError:
                pass
        return "\n".join(parts)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_lines(self, level: str) -> list[str]:
        """The log lines of `level` (their first line; stack traces follow on lines of their own)."""
        return [ln for ln in self.log_text().splitlines() if (m := _LOG_LINE.match(ln)) and m.group(1) == level]

    # REST

    def rest(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> tuple[int, Any]:
        """(HTTP status, decoded JSON body); status 0 when nothing answered (not listening yet)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with _HTTP.open(request, timeout=timeout) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            return 0, str(exc)

    def put_connector(self, name: str, config: dict[str, str]) -> None:
        """PUT the connector's config, retried while the worker answers that it cannot yet (a rebalance)."""
        deadline = time.monotonic() + CONNECTOR_TIMEOUT_S
        while True:
            self._check_alive(f"while creating {name}")
            status, body = self.rest("PUT", f"/connectors/{name}/config", {"name": name, **config})
            if status in (200, 201):
                return
            if 400 <= status < 500 and status != 409:   # 409: a rebalance is under way
                raise AssertionError(f"PUT /connectors/{name}/config: {status} {body!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"PUT /connectors/{name}/config: {status} {body!r}\n{self.log_tail()}")
            time.sleep(1.0)

    @property
    def worker_id(self) -> str:
        """How the worker names itself in statuses (its REST listener)."""
        return f"127.0.0.1:{self.port}"

    def connector_state(self, name: str) -> tuple[str, list[str]]:
        """(connector state, task states) from GET /connectors/<name>/status, each "" unless this worker runs
        it (a status written by a worker that was killed stays in the status topic until it is replaced)."""
        status, body = self.rest("GET", f"/connectors/{name}/status", timeout=30)
        if status != 200:
            return "", []
        tasks = body.get("tasks", [])
        if body["connector"].get("state") == "FAILED" or any(t.get("state") == "FAILED" for t in tasks):
            raise AssertionError(f"{name} failed: {json.dumps(body, indent=1)[:4000]}")

        def state(entry: dict) -> str:
            return entry["state"] if entry.get("worker_id") == self.worker_id else ""

        return state(body["connector"]), [state(t) for t in tasks]

    def wait_state(self, name: str, state: str) -> None:
        """Until the connector and each of its tasks (one at least) is in `state` on this worker."""
        def reached() -> bool:
            self._check_alive(f"while waiting for {name} {state}")
            connector, tasks = self.connector_state(name)
            return connector == state and bool(tasks) and all(t == state for t in tasks)

        wait_until(reached, timeout=CONNECTOR_TIMEOUT_S, interval=0.5, what=f"{name} {state} on {self.name}")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


@pytest.fixture
def connect_workers(tmp_path, connect_runtime):
    """Makes ConnectWorkers; every JVM is killed by its pid at the end, whatever happened."""
    made: list[ConnectWorker] = []

    def make(name: str, bootstrap: str) -> ConnectWorker:
        worker = ConnectWorker(tmp_path, name, connect_runtime, bootstrap)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.kill()


# -- the files --------------------------------------------------------------------------------------------------


class InputFile:
    """The source's file: lines appended in numbered waves, each wave one write of whole lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []
        self.waves = 0
        path.write_bytes(b"")

    def append_wave(self, count: int = 20) -> None:
        self.waves += 1
        wave = self.waves
        # Lengths vary; quotes, a backslash, a tab and braces go through the JSON converter and back. ASCII
        # only: FileStreamSource stores its position in characters read but skips that many *bytes* when it
        # starts again, so a file with multi-byte characters is re-read in part after a restart (Connect's
        # example connector, not the broker: seen as a stored position short of the file's size by exactly
        # the extra bytes of its non-ASCII characters).
        new = [f"wave {wave:02d} line {i:03d} " + "x" * ((wave * 7 + i * 13) % 40)
               + (' "quoted" back\\slash\ttab {"k": [1, 2]}' if i % 5 == 0 else "") for i in range(count)]
        with open(self.path, "ab") as f:
            f.write("".join(f"{line}\n" for line in new).encode())
        self.lines += new


def complete_lines(path: Path) -> list[str]:
    """The lines of a file that the sink has finished writing (a last line without its newline is not)."""
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


def wait_round_trip(output: Path, expected: list[str], worker: ConnectWorker) -> None:
    """Until the output file holds exactly `expected`; fails at once on a wrong, duplicated or extra line."""
    deadline = time.monotonic() + ROUND_TRIP_TIMEOUT_S
    while True:
        got = complete_lines(output)
        for i, (a, b) in enumerate(zip(got, expected, strict=False)):
            assert a == b, f"output line {i}: {a!r}, expected {b!r} (lines {len(got)}, written {len(expected)})"
        assert len(got) <= len(expected), \
            f"output has {len(got) - len(expected)} more lines than were written, first extra: {got[len(expected)]!r}"
        if len(got) == len(expected):
            return
        worker._check_alive("during the round trip")
        if time.monotonic() > deadline:
            raise AssertionError(f"output stalled at {len(got)} of {len(expected)} lines after "
                                 f"{ROUND_TRIP_TIMEOUT_S:.0f} s\n{worker.log_tail()}")
        time.sleep(0.2)


# -- reading topics ---------------------------------------------------------------------------------------------


class TopicRead:
    """Every record of a topic read from offset 0 of each partition up to the high watermarks of the moment."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oncelog-test-{uuid.uuid4().hex[:8]}",
                             "enable.auto.commit": False, "enable.partition.eof": True})
        try:
            meta = consumer.list_topics(topic, timeout=30)
            assert topic in meta.topics and meta.topics[topic].error is None, f"{topic}: {meta.topics.get(topic)}"
            self.partitions = sorted(meta.topics[topic].partitions)
            self.marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                          for p in self.partitions}
            # (partition, offset, key, value), in offset order per partition
            self.records: list[tuple[int, int, bytes | None, bytes | None]] = []
            todo = {p for p, (low, high) in self.marks.items() if high > low}
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(todo)])
            deadline = time.monotonic() + 60
            while todo:
                assert time.monotonic() < deadline, f"{topic}: partitions {sorted(todo)} not read to their end"
                for msg in consumer.consume(500, timeout=1.0):
                    p = msg.partition()
                    if msg.error():
                        if msg.error().code() == KafkaError._PARTITION_EOF:
                            if msg.offset() >= self.marks[p][1]:
                                todo.discard(p)
                            continue
                        raise AssertionError(f"{topic}[{p}]: {msg.error()}")
                    if msg.offset() < self.marks[p][1]:
                        self.records.append((p, msg.offset(), msg.key(), msg.value()))
                    if msg.offset() >= self.marks[p][1] - 1:
                        todo.discard(p)
        finally:
            consumer.close()

    @property
    def written(self) -> int:
        """Offsets handed out (each a record written: no transactions here)."""
        return sum(high for _, high in self.marks.values())

    @property
    def log_start(self) -> int:
        return sum(low for low, _ in self.marks.values())

    def latest(self) -> dict[tuple[int, bytes | None], tuple[int, bytes | None]]:
        """(offset, value) of the newest record of every key, per partition."""
        return {(p, key): (offset, value) for p, offset, key, value in self.records}


def lost_by_cleaning(before: TopicRead, after: TopicRead) -> list[str]:
    """Keys whose newest record of `before` is gone from `after` or changed, unless a newer record of the key
    (written after `before` was read) replaced it: what the cleaner must never do."""
    now = after.latest()
    problems = []
    for (p, key), (offset, value) in before.latest().items():
        newest = now.get((p, key))
        if newest is None or (newest[0] < before.marks[p][1] and newest != (offset, value)):
            problems.append(f"{before.topic}[{p}] key {key!r}: newest was {(offset, value)!r}, now {newest!r}")
    return problems


def source_position(bootstrap: str, input_path: Path) -> int | None:
    """The newest position the source stored for its file in the offsets topic (None: none stored)."""
    position = None
    for _, _, key, value in TopicRead(bootstrap, OFFSET_TOPIC).records:
        if key is None or json.loads(key) != [SOURCE, {"filename": str(input_path)}]:
            continue
        position = None if value is None else json.loads(value)["position"]
    return position


def broker_problems(log_path: Path) -> list[str]:
    """Broker log lines that start a traceback or are logged at ERROR or CRITICAL."""
    lines = log_path.read_text(errors="replace").splitlines()
    return [ln for ln in lines if ln.startswith("Traceback") or re.match(r"^\S+ \S+ (ERROR|CRITICAL) ", ln)]


# -- the tests --------------------------------------------------------------------------------------------------


def first_appearances(lines: list[str]) -> list[str]:
    """The lines in the order they first appear, repeats dropped."""
    seen: set[str] = set()
    return [ln for ln in lines if not (ln in seen or seen.add(ln))]


class Pipeline:
    """The broker, the data topic (one partition: the order of the lines is kept), the source's input file and
    the sink's output file."""

    def __init__(self, broker, directory: Path) -> None:
        self.broker = broker
        self.bootstrap = broker.bootstrap
        create_topic(self.bootstrap, DATA_TOPIC, partitions=1)
        self.input = InputFile(directory / "input.txt")
        self.output = directory / "output.txt"

    def create_connectors(self, worker: ConnectWorker) -> None:
        """Both connectors through the REST API, then until both and their tasks run."""
        worker.put_connector(SOURCE, {"connector.class": SOURCE_CLASS, "tasks.max": "1",
                                      "file": str(self.input.path), "topic": DATA_TOPIC})
        worker.put_connector(SINK, {"connector.class": SINK_CLASS, "tasks.max": "1",
                                    "file": str(self.output), "topics": DATA_TOPIC})
        self.wait_running(worker)

    @staticmethod
    def wait_running(worker: ConnectWorker) -> None:
        worker.wait_state(SOURCE, "RUNNING")
        worker.wait_state(SINK, "RUNNING")

    def waves(self, count: int, worker: ConnectWorker) -> None:
        """Waves of lines, each waited for until the output file is exactly the input."""
        for _ in range(count):
            self.input.append_wave()
            wait_round_trip(self.output, self.input.lines, worker)

    def data_lines(self) -> list[str]:
        return [json.loads(value) for _, _, _, value in TopicRead(self.bootstrap, DATA_TOPIC).records]


def assert_logs_clean(workers: list[ConnectWorker], broker) -> None:
    """No ERROR in any worker log and no WARN naming one of the topics; no traceback or ERROR in the broker's."""
    topic_names = re.compile("|".join(re.escape(t) for t in (*INTERNAL_TOPICS, DATA_TOPIC)))
    for worker in workers:
        assert worker.log_lines("ERROR") == [], f"{worker.name}:\n{worker.log_tail(200)}"
        assert [ln for ln in worker.log_lines("WARN") if topic_names.search(ln)] == [], worker.name
    assert broker_problems(broker.log_path) == [], broker.log_tail(80)


@pytest.mark.timeout(600)
def test_connect_distributed_round_trip_restart_on_compacted_topics(broker_factory, connect_workers, tmp_path):
    """Graceful stops only, so the round trip is exact (see the module docstring), through a restart of the
    worker on internal topics the cleaner has cleaned."""
    broker = broker_factory(BROKER)
    pipe = Pipeline(broker, tmp_path)

    # 1. A worker, the two connectors through REST, waves of lines round-tripped.
    first = connect_workers("worker-1", pipe.bootstrap).start()
    pipe.create_connectors(first)
    pipe.waves(6, first)

    # 2. The sink paused and resumed three times, a wave each time it is paused: the same config and status keys
    #    written again and again, more than a segment's age apart, so closed segments hold superseded records.
    for _ in range(3):
        assert first.rest("PUT", f"/connectors/{SINK}/pause")[0] == 202
        first.wait_state(SINK, "PAUSED")
        time.sleep(1.2)
        pipe.input.append_wave()
        time.sleep(1.2)
        assert len(complete_lines(pipe.output)) < len(pipe.input.lines), "the paused sink went on writing"
        assert first.rest("PUT", f"/connectors/{SINK}/resume")[0] == 202
        first.wait_state(SINK, "RUNNING")
        wait_round_trip(pipe.output, pipe.input.lines, first)
        time.sleep(1.2)
    pipe.waves(2, first)

    # 3. Connect's topics: compacted, with Connect's partition counts.
    client = admin(pipe.bootstrap)
    futures = client.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in INTERNAL_TOPICS])
    policies = {res.name: fut.result(timeout=30)["cleanup.policy"].value for res, fut in futures.items()}
    assert policies == dict.fromkeys(INTERNAL_TOPICS, "compact")
    meta = client.list_topics(timeout=30)
    assert {t: len(meta.topics[t].partitions) for t in INTERNAL_TOPICS} == INTERNAL_PARTITIONS

    # 4. The cleaner has run on each of them: fewer records from offset 0 than were written, the log start still
    #    0, and the newest record of every key kept (with its offset) unless a newer one came.
    before = {t: TopicRead(pipe.bootstrap, t) for t in INTERNAL_TOPICS}
    after = wait_cleaned(pipe.bootstrap, INTERNAL_TOPICS)
    for topic in INTERNAL_TOPICS:
        assert after[topic].log_start == 0, (topic, after[topic].marks)
        assert lost_by_cleaning(before[topic], after[topic]) == []
    print(f"\n[connect] records removed by the cleaner: "
          f"{ {t: after[t].written - len(after[t].records) for t in INTERNAL_TOPICS} }, "
          f"written: { {t: after[t].written for t in INTERNAL_TOPICS} }")

    # 5. A graceful stop; the source's stored position is the whole file.
    assert first.stop() in (0, 128 + signal.SIGTERM)
    assert any("Kafka Connect stopped" in ln for ln in first.log_lines("INFO")), first.log_tail()
    assert source_position(pipe.bootstrap, pipe.input.path) == pipe.input.path.stat().st_size

    # 6. A new worker process on the cleaned topics: the connectors come back without a REST call, the source
    #    goes on from its stored position and the sink from its committed offset.
    second = connect_workers("worker-2", pipe.bootstrap).start()
    pipe.wait_running(second)
    status, names = second.rest("GET", "/connectors")
    assert status == 200 and sorted(names) == sorted([SOURCE, SINK])
    pipe.waves(4, second)

    # 7. Every line in the data topic once, in order; the output file exactly the input.
    assert pipe.data_lines() == pipe.input.lines
    assert complete_lines(pipe.output) == pipe.input.lines
    assert pipe.output.read_bytes().endswith(b"\n")
    assert second.stop() in (0, 128 + signal.SIGTERM)

    # 8. Logs: no ERROR in either worker, no WARN about the topics; nothing wrong in the broker.
    assert_logs_clean([first, second], broker)


@pytest.mark.interop_slow  # make interop-test: out of make test's time budget; the graceful round trip stays in it
@pytest.mark.timeout(600)
def test_connect_through_sigkill_of_worker_and_broker(broker_factory, connect_workers, tmp_path):
    """At-least-once through crashes: the worker SIGKILLed while a wave is on its way, then the broker SIGKILLed
    and restarted while the next one is. After a crash Connect delivers again what followed the last committed
    offsets, so lines may repeat; none may be lost or come before a line written earlier. So: the data topic
    and the output file hold every input line, in the input's order when repeats are dropped (the output may
    also hold one torn line per killed worker: the sink writes a line and its newline in two writes). After the
    crashes, the connectors run again from the compacted topics without a REST call, and a graceful stop at
    the end stores the source's position at the file's end."""
    broker = broker_factory(BROKER)
    pipe = Pipeline(broker, tmp_path)
    first = connect_workers("worker-1", pipe.bootstrap).start()
    pipe.create_connectors(first)
    pipe.waves(3, first)

    def mid_wave() -> None:
        """A big wave, and back as soon as part of it is in the output file (or after 5 s)."""
        done = len(complete_lines(pipe.output))
        pipe.input.append_wave(400)
        deadline = time.monotonic() + 5
        while len(complete_lines(pipe.output)) == done and time.monotonic() < deadline:
            time.sleep(0.02)

    # 1. The worker SIGKILLed mid-wave; a new one resumes from the last committed offsets.
    mid_wave()
    first.kill()
    second = connect_workers("worker-2", pipe.bootstrap).start()
    pipe.wait_running(second)
    wait_at_least_once(pipe, second, torn_allowed=1)

    # 2. The broker SIGKILLed mid-wave and started again on its port; the worker goes on.
    mid_wave()
    broker.kill()
    broker.start()
    wait_at_least_once(pipe, second, torn_allowed=1)
    pipe.wait_running(second)

    # 3. More lines after the crashes; the cleaner still runs on the recovered topics.
    pipe.input.append_wave()
    wait_at_least_once(pipe, second, torn_allowed=1)
    wait_cleaned(pipe.bootstrap, (OFFSET_TOPIC,))

    # 4. A graceful stop stores the position at the file's end; a third worker finds both connectors, and the
    #    lines written after a graceful restart arrive exactly once, in the data topic and in the output.
    assert second.stop() in (0, 128 + signal.SIGTERM)
    assert source_position(pipe.bootstrap, pipe.input.path) == pipe.input.path.stat().st_size
    data_before, output_before = len(pipe.data_lines()), len(complete_lines(pipe.output))
    third = connect_workers("worker-3", pipe.bootstrap).start()
    pipe.wait_running(third)
    pipe.input.append_wave()
    wait_at_least_once(pipe, third, torn_allowed=1)
    assert pipe.data_lines()[data_before:] == pipe.input.lines[-20:]
    assert complete_lines(pipe.output)[output_before:] == pipe.input.lines[-20:]
    assert third.stop() in (0, 128 + signal.SIGTERM)

    # 5. Logs.
    failed_commits = "Commit of offsets threw an unexpected exception"
    assert [ln for ln in second.log_lines("ERROR") if failed_commits not in ln] == [], second.log_tail(200)
    assert_logs_clean([third], broker)


def wait_at_least_once(pipe: Pipeline, worker: ConnectWorker, torn_allowed: int) -> None:
    """Until the output holds every input line; then the data topic and the output, repeats dropped, are the
    input in order, and at most `torn_allowed` output lines are not input lines."""
    expected = pipe.input.lines
    wanted = set(expected)

    def arrived() -> bool:
        worker._check_alive("while lines were awaited")
        return wanted <= set(complete_lines(pipe.output))

    try:
        wait_until(arrived, timeout=ROUND_TRIP_TIMEOUT_S + 60, interval=0.3, what="every input line in the output")
    except AssertionError:
        missing = [ln for ln in expected if ln not in set(complete_lines(pipe.output))]
        raise AssertionError(f"{len(missing)} input lines never reached the output, first {missing[:3]}\n"
                             f"{worker.log_tail()}") from None
    data = pipe.data_lines()
    assert first_appearances(data) == expected, "the data topic lost or reordered lines"
    out = complete_lines(pipe.output)
    torn = [ln for ln in out if ln not in wanted]
    assert len(torn) <= torn_allowed, torn
    assert first_appearances([ln for ln in out if ln in wanted]) == expected, "the output lost or reordered lines"


def wait_cleaned(bootstrap: str, topics: tuple[str, ...]) -> dict[str, TopicRead]:
    """Until fewer records than were written are read from offset 0 of each topic; what was read then."""
    def cleaned() -> dict[str, TopicRead] | None:
        now = {t: TopicRead(bootstrap, t) for t in topics}
        return now if all(len(r.records) < r.written for r in now.values()) else None

    try:
        return wait_until(cleaned, timeout=CLEAN_TIMEOUT_S, interval=1.0, what=f"{topics} cleaned")
    except AssertionError:
        now = {t: TopicRead(bootstrap, t) for t in topics}
        raise AssertionError("not cleaned: " + ", ".join(f"{t}: {len(r.records)} records of {r.written} written"
                                                         for t, r in now.items())) from None
