"""The Java client (org.apache.kafka:kafka-clients from Maven Central) against a real oncelog broker.

`tests/interop/java/` is a Maven project with one program, `oncelog.interop.Interop`, whose subcommands each
run one scenario with the Java producer, consumer and AdminClient and print one JSON object: every step's
value, or the exception the client raised (class, causes, message, stack excerpt). This driver builds the jar
once per session (`mvn -q -B package`; the first build resolves from Maven Central into ~/.m2, later ones
work offline), runs the subcommands against brokers started by the fixtures of tests/conftest.py, and asserts
on the JSON and on the broker log (no error after any scenario). Without `java` or `mvn`, or when Maven
Central cannot be reached for the first build, every test here is skipped with the reason.

Scenarios: round trips with every codec (both directions with librdkafka too); the AdminClient; transactions
(commit/abort under read_committed, fencing, KAFKA-9803 timeout recovery); consumer groups; KIP-664.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import (
    Out,
    ck_consume,
    ck_produce,
    create_topic,
    expected_records,
    fetch_raw,
    metric,
    scrape,
)
from tests.support.wire import Wire

JAVA_DIR = Path(__file__).parent / "java"
JAR = JAVA_DIR / "target" / "oncelog-java-interop.jar"
KAFKA_CLIENTS_VERSION = "4.4.0"  # pinned in java/pom.xml
# Client logs go to stderr (shown in assertion messages): warnings, plus the transaction manager's state changes
# ("Transiting to abortable error state", "ProducerId set to ... with epoch ...") that show how it reacted.
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
             "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients.producer.internals.TransactionManager=info",
             "-Dorg.slf4j.simpleLogger.showDateTime=true"]
BUILD_TIMEOUT_S = 900

# What Maven prints when it cannot reach a repository (first build without network, or offline with an empty
# ~/.m2): a skip, not a failure. A missing artifact on a reachable Central ("Could not find artifact") fails.
_OFFLINE = re.compile(
    r"Could not transfer|Unknown ?host|UnknownHostException|Network is unreachable|Connection refused|"
    r"Connect(ion)? timed out|Read timed out|No route to host|Temporary failure in name resolution|"
    r"offline mode|has not been downloaded from it before|Cannot access central|PKIX path",
    re.IGNORECASE,
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
ABORTABLE = {
    "org.apache.kafka.common.errors.InvalidProducerEpochException",
    "org.apache.kafka.common.errors.TransactionAbortableException",
    "org.apache.kafka.common.errors.UnknownProducerIdException",
    "org.apache.kafka.common.errors.InvalidTxnStateException",
    "org.apache.kafka.common.KafkaException",
}
FENCED = "org.apache.kafka.common.errors.ProducerFencedException"


# -- build and run ------------------------------------------------------------------------------------------


def _jar_up_to_date() -> bool:
    """The jar is newer than the pom and every source file (mvn would only repackage the same bytes)."""
    if not JAR.is_file():
        return False
    built = JAR.stat().st_mtime
    inputs = [JAVA_DIR / "pom.xml", *(JAVA_DIR / "src").rglob("*")]
    return all(f.stat().st_mtime < built for f in inputs if f.is_file())


@pytest.fixture(scope="session")
def java_jar() -> Path:
    """Build the interop jar once per session; skip with the reason where that is impossible."""
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None:
        pytest.skip("Java client interop: no `java` on PATH (a JDK 17+ is needed)")
    if mvn is None:
        pytest.skip("Java client interop: no `mvn` on PATH (Maven 3.8+ builds tests/interop/java)")
    if _jar_up_to_date():
        return JAR
    t0 = time.monotonic()
    try:
        proc = subprocess.run([mvn, "-q", "-B", "-Dstyle.color=never", "package"], cwd=JAVA_DIR,
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"Java client interop: `mvn package` did not finish in {BUILD_TIMEOUT_S} s "
                    "(Maven Central unreachable or very slow?)")
    output = _ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        if _OFFLINE.search(output):
            first = next((ln for ln in output.splitlines() if _OFFLINE.search(ln)), "")
            pytest.skip("Java client interop: Maven could not resolve kafka-clients "
                        f"{KAFKA_CLIENTS_VERSION} and its plugins (Maven Central unreachable and nothing in ~/.m2): "
                        f"{first.strip()[:300]}")
        if re.search(r"release version \d+ not supported|invalid target release", output):
            pytest.skip(f"Java client interop: the JDK Maven uses is older than 17: {output.strip()[-300:]}")
        pytest.fail(f"`mvn package` in {JAVA_DIR} failed (exit {proc.returncode}):\n{output[-6000:]}",
                    pytrace=False)
    if not JAR.is_file():
        pytest.fail(f"`mvn package` succeeded but {JAR} is missing", pytrace=False)
    print(f"\n[java interop] jar built in {time.monotonic() - t0:.1f} s")
    return JAR


class JavaRun:
    """The JSON a subcommand printed, with accessors whose failures explain themselves."""

    def __init__(self, data: dict[str, Any], stderr: str, argv: list[str]) -> None:
        self.data = data
        self.stderr = stderr
        self.argv = argv
        self.steps: dict[str, dict[str, Any]] = data.get("steps", {})

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def step(self, name: str) -> dict[str, Any]:
        assert name in self.steps, f"step {name!r} did not run; steps: {list(self.steps)}\n{self.context()}"
        return self.steps[name]

    def ok(self, name: str) -> bool:
        return bool(self.step(name)["ok"])

    def value(self, name: str) -> Any:
        """The step's value; fails with the Java exception (class, causes, stack excerpt) if it raised."""
        s = self.step(name)
        assert s["ok"], f"step {name!r} raised in the Java client:\n{self.explain(name)}"
        return s["value"]

    def error(self, name: str) -> dict[str, Any]:
        s = self.step(name)
        assert not s["ok"], f"step {name!r} succeeded where an exception was expected: {json.dumps(s)}"
        return s["error"]

    def error_class(self, name: str) -> str | None:
        s = self.step(name)
        return None if s["ok"] else s["error"]["class"]

    def explain(self, name: str) -> str:
        return json.dumps(self.step(name), indent=1) + "\n" + self.context()

    def context(self) -> str:
        tail = "\n".join(self.stderr.splitlines()[-25:])
        return f"command: {' '.join(self.argv[-12:])}\nJava stderr (tail):\n{tail}"

    def all_ok(self, *except_: str) -> None:
        bad = {n: s["error"] for n, s in self.steps.items() if not s["ok"] and n not in except_}
        assert not bad, "steps raised in the Java client:\n" + json.dumps(bad, indent=1) + "\n" + self.context()

    def reactions(self) -> dict[str, str]:
        """step -> 'ok' or the exception class the Java client raised (for the report and assertion messages)."""
        return {n: "ok" if s["ok"] else s["error"]["class"].rsplit(".", 1)[-1] for n, s in self.steps.items()}


def run_java(jar: Path, command: str, bootstrap: str, *, deadline_s: int = 90, **opts: Any) -> JavaRun:
    argv = [shutil.which("java") or "java", *JVM_FLAGS, "-jar", str(jar), command, "--bootstrap", bootstrap, "--deadline-s", str(deadline_s)]
    for key, val in opts.items():
        argv += [f"--{key.replace('_', '-')}", str(val)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s + 30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"java {command} did not exit in {deadline_s + 30} s (its watchdog failed too):\n"
                    f"{(exc.stderr or b'')[-3000:]!r}", pytrace=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        data = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"java {command} exited {proc.returncode} without a JSON result:\nstdout: {proc.stdout[-2000:]}\n"
                    f"stderr: {proc.stderr[-4000:]}", pytrace=False)
    run = JavaRun(data, proc.stderr, argv)
    assert proc.returncode == 0 and "watchdog" not in data and "fatal" not in data, (
        f"java {command} exit {proc.returncode}: {json.dumps({k: data.get(k) for k in ('watchdog', 'fatal')})}\n"
        f"steps: {run.reactions()}\n{run.context()}")
    assert data["client_version"] == KAFKA_CLIENTS_VERSION
    return run


class LogWatch:
    """The broker log written since a mark must hold no ERROR, CRITICAL or traceback."""

    BAD = re.compile(r" (ERROR|CRITICAL) |Traceback \(most recent call last\)")

    def __init__(self, broker) -> None:
        self.broker = broker
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return self.broker.log_path.stat().st_size
        except OSError:
            return 0

    def check(self) -> None:
        try:
            with open(self.broker.log_path, "rb") as fh:
                fh.seek(self.offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            text = ""
        bad = [ln for ln in text.splitlines() if self.BAD.search(ln)]
        assert not bad, "broker logged errors during the scenario:\n" + "\n".join(bad[:20]) + \
            f"\n--- broker log tail ---\n{self.broker.log_tail(60)}"


@pytest.fixture
def watch_log():
    """watch_log(broker) marks the broker log now; at teardown, what was written since must be clean."""
    watches: list[LogWatch] = []

    def mark(broker) -> LogWatch:
        w = LogWatch(broker)
        watches.append(w)
        return w

    yield mark
    for w in watches:
        w.check()


def b64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def batch_codecs(bootstrap: str, topic: str, partition: int) -> set[int]:
    """The compression codec of every batch in a partition, read raw (attributes & 7)."""
    codecs: set[int] = set()
    offset = 0
    with Wire(bootstrap) as wire:
        while True:
            part = fetch_raw(wire, topic, partition, offset)
            data = part.records or b""
            if not data:
                return codecs
            pos = 0
            while pos + 61 <= len(data):
                base_offset = int.from_bytes(data[pos:pos + 8], "big", signed=True)
                length = int.from_bytes(data[pos + 8:pos + 12], "big")
                if pos + 12 + length > len(data):
                    break
                attributes = int.from_bytes(data[pos + 21:pos + 23], "big")
                last_delta = int.from_bytes(data[pos + 23:pos + 27], "big")
                codecs.add(attributes & 7)
                offset = base_offset + last_delta + 1
                pos += 12 + length
            if part.high_watermark <= offset:
                return codecs


# -- 1. round trips -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(CODEC_IDS))
def test_roundtrip_idempotent_producer_and_assign_consumer(java_jar, module_broker, topic_name, watch_log, codec):
    """The Java producer (acks=all, idempotence on) writes keys, null keys, null/empty values, repeated and
    null-valued headers, CreateTime timestamps with `codec`; the Java consumer (assign mode) reads exactly that
    back; librdkafka reads exactly the same; the batches on the broker carry the codec."""
    watch_log(module_broker)
    count, partitions = 300, 3
    run = run_java(java_jar, "roundtrip", module_broker.bootstrap, topic=topic_name, count=count,
                   partitions=partitions, compression=codec)
    run.all_ok()
    compare = run["compare"]
    assert compare["mismatches"] == [] and compare["extra"] == [], compare
    assert compare["acked"] == compare["consumed"] == count

    produced = run["produced"]
    # offsets are dense per partition, in send order
    for p in range(partitions):
        assert [r["offset"] for r in produced if r["partition"] == p] == list(range(count // partitions))
    # idempotence really on: one producer id per partition, epoch 0, last sequence = records - 1
    producers = run.value("describe_producers")
    for p in range(partitions):
        (state,) = producers[f"{topic_name}-{p}"]
        assert state["producer_id"] >= 0 and state["producer_epoch"] == 0
        assert state["last_sequence"] == count // partitions - 1
        assert state["current_txn_start_offset"] is None

    # librdkafka reads the same records the Java client wrote
    outs = [Out(r["partition"], b64(r["key"]), b64(r["value"]),
                tuple((k, b64(v)) for k, v in r["headers"]), r["timestamp"]) for r in produced]
    expected = expected_records(outs, [(r["partition"], r["offset"]) for r in produced])
    assert ck_consume(module_broker.bootstrap, topic_name, {p: 0 for p in range(partitions)}) == expected

    for p in range(partitions):
        assert batch_codecs(module_broker.bootstrap, topic_name, p) == {CODEC_IDS[codec]}


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_java_consumer_reads_what_librdkafka_wrote(java_jar, module_broker, topic_name, watch_log, codec):
    watch_log(module_broker)
    create_topic(module_broker.bootstrap, topic_name, partitions=2)
    outs = []
    for i in range(120):
        headers = (("h", f"x{i}".encode()), ("h", None)) if i % 4 == 0 else ()
        outs.append(Out(i % 2, None if i % 9 == 0 else f"k{i}".encode(),
                        None if i % 10 == 5 else f"v{i}".encode() * (i % 13), headers, 1_790_000_000_000 + i))
    acked = ck_produce(module_broker.bootstrap, topic_name, outs, **{"compression.codec": codec})
    expected = expected_records(outs, acked)
    run = run_java(java_jar, "consume", module_broker.bootstrap, topic=topic_name, partitions=2)
    got = [(r["partition"], r["offset"], b64(r["key"]), b64(r["value"]),
            tuple((k, b64(v)) for k, v in r["headers"]), r["timestamp"], r["timestamp_type"])
           for r in run.value("consume")]
    assert got == [(r.partition, r.offset, r.key, r.value, r.headers, r.timestamp, "CreateTime") for r in expected]


# -- 2. AdminClient -----------------------------------------------------------------------------------------


def test_admin_client(java_jar, module_broker, topic_name, watch_log):
    watch_log(module_broker)
    run = run_java(java_jar, "admin", module_broker.bootstrap, topic=topic_name)
    errors = "org.apache.kafka.common.errors."
    run.value("create")
    assert run.error("create_again")["class"] == errors + "TopicExistsException"
    assert run.error("create_rf2")["class"] == errors + "InvalidReplicationFactorException"
    run.value("create_validate_only")
    topics = run.value("list_topics")
    assert topic_name in topics and f"{topic_name}-validate-only" not in topics and f"{topic_name}-rf2" not in topics

    desc = run.value("describe_topic")
    assert desc["name"] == topic_name and not desc["internal"]
    assert desc["partitions"] == [{"partition": p, "leader": 0, "replicas": [0], "isr": [0]} for p in range(3)]

    before = run.value("describe_configs")
    assert before["retention.ms"]["value"] == "3600000"
    assert before["retention.ms"]["source"] == "DYNAMIC_TOPIC_CONFIG"
    assert before["segment.bytes"]["source"] == "DEFAULT_CONFIG"
    run.value("alter_configs")
    after = run.value("describe_configs_after")
    assert after["retention.ms"] == {**before["retention.ms"], "value": "7200000"}
    assert after["max.message.bytes"]["value"] == "2000000"
    assert after["max.message.bytes"]["source"] == "DYNAMIC_TOPIC_CONFIG"
    assert after["segment.ms"]["source"] == "DEFAULT_CONFIG"
    deleted = run.value("alter_configs_delete")
    assert deleted["retention.ms"]["source"] == "DEFAULT_CONFIG"
    assert deleted["retention.ms"]["value"] == "604800000"
    assert run.error("alter_configs_invalid_value")["class"] == errors + "InvalidConfigurationException"
    assert run.error("alter_configs_unknown_key")["class"] == errors + "InvalidConfigurationException"
    broker_cfg = run.value("describe_broker_configs")
    assert broker_cfg["num.partitions"] == "1" and broker_cfg["entries"] > 10

    assert run.value("produce") == list(range(10))
    base = run["base_timestamp"]
    offsets = run.value("list_offsets")
    assert offsets["earliest"]["offset"] == 0 and offsets["latest"]["offset"] == 10
    assert offsets["max_timestamp"] == {"offset": 6, "timestamp": base + 90_000, "leader_epoch": 0}
    assert offsets["for_timestamp_base_plus_3500"]["offset"] == 4
    assert offsets["for_timestamp_base_plus_3500"]["timestamp"] == base + 4000
    assert offsets["for_timestamp_future"]["offset"] == -1
    assert run.value("delete_records") == 4
    after_delete = run.value("list_offsets_after_delete")
    assert after_delete["earliest"]["offset"] == 4 and after_delete["latest"]["offset"] == 10
    assert run.error("delete_records_beyond_end")["class"] == errors + "OffsetOutOfRangeException"
    assert run.value("consume_after_delete") == {"0": [[o, f"v{o}"] for o in range(4, 10)]}

    cluster = run.value("describe_cluster")
    assert cluster["cluster_id"] and cluster["controller"] == 0
    assert cluster["nodes"] == [{"id": 0, "host": "127.0.0.1", "port": module_broker.port, "rack": None}]
    (logdir,) = run.value("describe_log_dirs").values()
    assert logdir["error"] is None and logdir["replicas"][f"{topic_name}-0"] > 0
    assert run.value("create_partitions") == 4
    run.value("delete_topic")
    assert topic_name not in run.value("list_topics_after_delete")
    assert run.error("describe_deleted_topic")["class"] == errors + "UnknownTopicOrPartitionException"


# -- 3. transactions ----------------------------------------------------------------------------------------


def test_transactions_commit_visible_abort_invisible(java_jar, module_broker, topic_name, watch_log):
    watch_log(module_broker)
    run = run_java(java_jar, "txn", module_broker.bootstrap, topic=topic_name)
    run.all_ok()
    c1 = {"0": [[o, f"c1-p0-{o}"] for o in range(4)], "1": [[o, f"c1-p1-{o}"] for o in range(4)]}
    # offsets: 4 committed, marker, 3 aborted, marker, 2 committed, marker
    assert run.value("commit1") == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert run.value("abort1") == [[5, 6, 7], [5, 6, 7]]
    assert run.value("open_txn") == [9, 10]
    # an open transaction holds the last stable offset at its first offset; read_committed stops there
    assert run.value("offsets_while_open") == {"earliest": 0, "latest": 11, "last_stable": 9}
    assert run.value("read_committed_while_open") == c1
    open_txn = run.value("describe_txn_while_open")
    assert open_txn["state"] == "ONGOING" and open_txn["partitions"] == [f"{topic_name}-0"]
    assert run.value("offsets_after_commit") == {"earliest": 0, "latest": 12, "last_stable": 12}
    assert run.value("read_committed") == {"0": c1["0"] + [[9, "c2-p0-0"], [10, "c2-p0-1"]], "1": c1["1"]}
    assert run.value("read_uncommitted") == {
        "0": c1["0"] + [[5 + i, f"a1-p0-{i}"] for i in range(3)] + [[9, "c2-p0-0"], [10, "c2-p0-1"]],
        "1": c1["1"] + [[5 + i, f"a1-p1-{i}"] for i in range(3)],
    }
    # sendOffsetsToTransaction: the committed transaction's offset, not the aborted one's
    assert run.value("group_offsets") == {f"{topic_name}-0": {"offset": 42, "metadata": "committed-in-txn"}}
    done = run.value("describe_txn_after")
    assert done["state"] == "COMPLETE_COMMIT" and done["partitions"] == []


def test_transaction_fencing_by_a_second_instance(java_jar, module_broker, topic_name, watch_log):
    """A new producer with the same transactional.id fences the first: the zombie's commit gets
    ProducerFencedException; a zombie that sends first gets an abortable InvalidProducerEpochException on the
    send (Produce answered INVALID_PRODUCER_EPOCH), then ProducerFencedException from its abort."""
    watch_log(module_broker)
    run = run_java(java_jar, "txn-fence", module_broker.bootstrap, topic=topic_name)
    why = run.reactions()
    for variant in ("commit_first", "send_first"):
        run.value(f"{variant}.zombie_init_send")
        before = run.value(f"{variant}.txn_before_fence")
        assert before["state"] == "ONGOING", why
        run.value(f"{variant}.fresh_init")
        fenced = run.value(f"{variant}.txn_after_fence")
        assert fenced["producer_id"] == before["producer_id"], why
        assert fenced["producer_epoch"] > before["producer_epoch"], why
        assert fenced["state"] in ("EMPTY", "COMPLETE_ABORT"), why
        assert run.error_class(f"{variant}.zombie_abort") == FENCED, why
        run.value(f"{variant}.fresh_commit")
        assert run.value(f"{variant}.txn_after")["state"] == "COMPLETE_COMMIT"
    assert run.error_class("commit_first.zombie_commit") == FENCED, why
    assert run.error_class("send_first.zombie_send") == \
        "org.apache.kafka.common.errors.InvalidProducerEpochException", why
    assert run.error_class("send_first.zombie_commit") in ABORTABLE | {FENCED}, why
    assert run.value("read_committed") == {"0": [[2, "commit_first-fresh-1"], [6, "send_first-fresh-1"]]}
    # the zombies' first records were written and then aborted; nothing after the fence was written
    assert [v for _, v in run.value("read_uncommitted")["0"]] == [
        "commit_first-zombie-1", "commit_first-fresh-1", "send_first-zombie-1", "send_first-fresh-1"]


@pytest.mark.parametrize("mode", ["send", "commit", "offsets"])
def test_transaction_timeout_recovery_kafka_9803(java_jar, broker_factory, topic_name, watch_log, mode):
    """transaction.timeout.ms=2000, reaper every 300 ms; the producer sleeps 3.5 s inside its transaction.
    The coordinator aborts it and bumps the epoch; the owner's next call (a send, or a commit) fails with an
    abortable exception, not ProducerFencedException; abortTransaction() succeeds; the next transaction
    commits and is the only thing read_committed sees."""
    broker = broker_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": 300})
    watch_log(broker)
    run = run_java(java_jar, "txn-timeout", broker.bootstrap, topic=topic_name, mode=mode,
                   txn_timeout_ms=2000, sleep_ms=3500)
    why = f"Java client reactions: {run.reactions()}"
    run.value("init")
    run.value("begin_and_write")
    before = run.value("txn_before_timeout")
    assert before["state"] == "ONGOING", why
    after = run.value("txn_after_timeout")
    assert after["state"] in ("PREPARE_ABORT", "COMPLETE_ABORT"), why
    assert after["producer_id"] == before["producer_id"] and after["producer_epoch"] == before["producer_epoch"] + 1
    if mode == "send":
        # Produce at the old epoch: INVALID_PRODUCER_EPOCH, which the Java client treats as abortable
        assert run.error_class("send_after_timeout") == \
            "org.apache.kafka.common.errors.InvalidProducerEpochException", why
    commit_error = run.error("commit_after_timeout")
    assert commit_error["class"] != FENCED and FENCED not in commit_error["chain"], why
    assert commit_error["class"] in ABORTABLE, why
    assert run.ok("abort"), f"abortTransaction() after the timeout failed:\n{run.explain('abort')}"
    hint = ""
    if commit_error["class"].endswith("TransactionAbortableException"):
        hint = ("\nhint: kafka-clients 4.4 handles TRANSACTION_ABORTABLE on EndTxn/AddPartitionsToTxn/AddOffsetsToTxn "
                "with abortableError() (no epoch bump), so abortTransaction() sends no InitProducerId and the producer "
                "keeps the stale epoch; UNKNOWN_PRODUCER_ID goes through abortableErrorIfPossible(), which flags the "
                "bump. The coordinator should answer the timed-out owner with UNKNOWN_PRODUCER_ID on those APIs.")
    assert run.ok("next_txn"), (
        f"the transaction after the recovery failed ({why}):\n{run.explain('next_txn')}\n"
        f"coordinator after the abort: {run.step('txn_after_abort')}{hint}")
    final = run.value("txn_after_next")
    assert final["state"] == "COMPLETE_COMMIT" and final["producer_epoch"] >= after["producer_epoch"], why
    assert [v for _, v in run.value("read_committed").get("0", [])] == ["t2-r1"]
    expected_uncommitted = ["t2-r1"] if mode == "offsets" else ["t1-r1", "t2-r1"]
    assert [v for _, v in run.value("read_uncommitted").get("0", [])] == expected_uncommitted
    offs = run.value("offsets_after_next")
    assert offs["last_stable"] == offs["latest"], offs


# -- 4. consumer groups -------------------------------------------------------------------------------------


def _check_group_first(run: JavaRun, topic: str) -> None:
    first = run.value("first_consumer")
    assert first["assignment"] == [f"{topic}-0", f"{topic}-1"]
    assert first["committed"] == {f"{topic}-0": {"offset": 4, "metadata": "interop-first"},
                                  f"{topic}-1": {"offset": 6, "metadata": "interop-first"}}
    active = first["group_while_active"]
    assert active["state"] == "STABLE" and active["type"] == "CLASSIC" and active["assignor"] == "range"
    assert [m["member_id"] for m in active["members"]] == [first["member_id"]]
    assert active["members"][0]["assignment"] == [f"{topic}-0", f"{topic}-1"]
    assert first["generation"] >= 1
    assert run.value("group_after_close")["state"] == "EMPTY"
    assert run.value("group_after_close")["members"] == []
    assert run.value("group_offsets") == {f"{topic}-0": 4, f"{topic}-1": 6}


def _check_group_second(run: JavaRun, topic: str) -> None:
    second = run.value("second_consumer")
    assert sorted(map(tuple, second["seen"])) == (
        [(0, o, f"g-p0-{o}") for o in range(4, 10)] + [(1, o, f"g-p1-{o}") for o in range(6, 10)])
    assert run.value("group_offsets_final") == {f"{topic}-0": 10, f"{topic}-1": 10}
    (listing,) = run.value("list_groups")
    assert listing["state"] == "EMPTY" and listing["protocol"] == "consumer"
    run.value("delete_group")
    assert run.value("group_offsets_after_delete") == {}


def test_consumer_group_commit_and_resume(java_jar, broker_factory, topic_name, watch_log):
    broker = broker_factory({"group.initial.rebalance.delay.ms": 0})
    watch_log(broker)
    run = run_java(java_jar, "groups", broker.bootstrap, topic=topic_name)
    _check_group_first(run, topic_name)
    _check_group_second(run, topic_name)


def test_consumer_group_resumes_after_broker_sigkill(java_jar, broker_factory, topic_name, watch_log):
    broker = broker_factory({"group.initial.rebalance.delay.ms": 0})
    watch_log(broker)
    _check_group_first(run_java(java_jar, "groups", broker.bootstrap, topic=topic_name, phase="first"), topic_name)
    broker.restart()  # SIGKILL, then the same port
    watch_log(broker)
    _check_group_second(run_java(java_jar, "groups", broker.bootstrap, topic=topic_name, phase="second"),
                        topic_name)


# -- 5. KIP-664 ---------------------------------------------------------------------------------------------


def test_kip664_describe_producers_list_and_describe_transactions(java_jar, module_broker, topic_name, watch_log):
    watch_log(module_broker)
    run = run_java(java_jar, "kip664", module_broker.bootstrap, topic=topic_name)
    run.all_ok("describe_unknown_transaction")
    x_id = f"{topic_name}-x"
    tp0, tp1 = f"{topic_name}-0", f"{topic_name}-1"

    producers = run.value("describe_producers")
    (txn_state,) = producers[tp0]
    (idem_state,) = producers[tp1]
    assert txn_state["current_txn_start_offset"] == 0 and txn_state["last_sequence"] == 2
    assert idem_state["current_txn_start_offset"] is None and idem_state["last_sequence"] == 1
    assert txn_state["producer_id"] != idem_state["producer_id"]
    x_pid = txn_state["producer_id"]

    def ids(step: str) -> dict[str, str]:
        return {t["transactional_id"]: t["state"] for t in run.value(step) if t["transactional_id"].startswith(topic_name)}

    assert ids("list_transactions") == {x_id: "ONGOING"}
    assert {t["transactional_id"]: t["producer_id"] for t in run.value("list_transactions")}[x_id] == x_pid
    assert ids("list_transactions_ongoing") == {x_id: "ONGOING"}
    assert all(t["state"] == "ONGOING" for t in run.value("list_transactions_ongoing"))
    assert all(t["state"] == "COMPLETE_COMMIT" for t in run.value("list_transactions_complete_commit"))
    assert x_id not in ids("list_transactions_complete_commit")
    assert [t["transactional_id"] for t in run.value("list_transactions_by_producer")] == [x_id]
    assert run.value("list_transactions_by_other_producer") == []
    assert x_id not in ids("list_transactions_longer_than_1h")
    assert x_id in ids("list_transactions_longer_than_0")

    desc = run.value("describe_transaction")
    assert desc["state"] == "ONGOING" and desc["producer_id"] == x_pid and desc["producer_epoch"] == 0
    assert desc["timeout_ms"] == 60000 and desc["partitions"] == [tp0] and desc["start_ms"] > 0
    assert desc["coordinator_id"] == 0
    assert run.error_class("describe_unknown_transaction") == \
        "org.apache.kafka.common.errors.TransactionalIdNotFoundException"
    committed = run.value("describe_transaction_after_commit")
    assert committed["state"] == "COMPLETE_COMMIT" and committed["partitions"] == []
    (after_commit,) = run.value("describe_producers_after_commit")[tp0]
    assert after_commit["current_txn_start_offset"] is None and after_commit["producer_id"] == x_pid
    assert ids("list_transactions_after_commit") == {x_id: "COMPLETE_COMMIT"}

    # Admin.abortTransaction (WriteTxnMarkers to the leader) releases the last stable offset
    before = run.value("hanging_offsets_before")
    assert before["last_stable"] == 2 and before["latest"] == 4
    assert run.value("hanging_describe_producers")["current_txn_start_offset"] == 2
    after = run.value("hanging_offsets_after")
    assert after["last_stable"] == after["latest"] == 5
    assert all(s["current_txn_start_offset"] is None for s in run.value("hanging_describe_producers_after")[tp1])
    assert run.value("hanging_read_committed") == {"1": [[0, "i-0"], [1, "i-1"]]}
    assert run.value("hanging_txn_state")["state"] == "ONGOING"
    assert run.value("hanging_txn_state_after")["state"] == "COMPLETE_ABORT"
    assert run.value("read_committed") == {
        "0": [[0, "x-0"], [1, "x-1"], [2, "x-2"]],
        "1": [[0, "i-0"], [1, "i-1"], [run.value("hanging_producer_next_txn")[0], "y2-0"]],
    }


# -- 6. KIP-320 position validation --------------------------------------------------------------------------


def test_java_consumer_validates_a_seek_with_its_leader_epoch(java_jar, broker_factory, topic_name, watch_log):
    """A seek with a leader epoch is checked with OffsetsForLeaderEpoch (v4) before the first fetch: inside epoch
    0 it reads from there; past the epoch's end it detects truncation and moves to that end (auto.offset.reset
    earliest only applies to an undefined end: an epoch the broker never had)."""
    broker = broker_factory(metrics=True)
    watch_log(broker)
    create_topic(broker.bootstrap, topic_name, 1)
    ck_produce(broker.bootstrap, topic_name, [Out(0, None, b"v%d" % i) for i in range(10)])
    before = metric(scrape(broker.metrics_port), "oncelog_requests_total", api="OFFSET_FOR_LEADER_EPOCH")
    run = run_java(java_jar, "epoch-validate", broker.bootstrap, topic=topic_name, end=10, seeks="5:0,100:0,5:3")
    run.all_ok()
    assert run.value("seek_5:0") == {"read": list(range(5, 10)), "position": 10}
    assert run.value("seek_100:0") == {"read": [], "position": 10}
    assert run.value("seek_5:3") == {"read": list(range(10)), "position": 10}
    after = metric(scrape(broker.metrics_port), "oncelog_requests_total", api="OFFSET_FOR_LEADER_EPOCH")
    assert after - before >= 3
