"""`oncelog topics|records|producers` end to end: the installed command (`python -m oncelog`) against a real
broker, exact `--json` output, exit status 1 with one line and no traceback on errors."""

from __future__ import annotations

import json

import pytest
from tests.integration.client.admin_support import cli_error, cli_json, run_cli
from tests.integration.helpers import Out, ck_consume, ck_produce, ck_producer


@pytest.fixture(scope="module")
def bootstrap(module_broker):
    return module_broker.bootstrap


def test_topics_create_list_describe_alter_delete(bootstrap, topic_name):
    created = cli_json(bootstrap, "topics", "create", topic_name, "--partitions", "3", "--config", "retention.ms=5000")
    topic_id = created["topic_id"]
    assert (created["name"], created["num_partitions"], created["replication_factor"], created["created"]) == (
        topic_name, 3, 1, True)
    assert created["configs"]["retention.ms"] == "5000" and len(topic_id) == 22

    listed = cli_json(bootstrap, "topics", "list")
    assert {"name": topic_name, "topic_id": topic_id, "internal": False, "partitions": 3} in listed

    (described,) = cli_json(bootstrap, "topics", "describe", topic_name)
    assert (described["name"], described["topic_id"], described["internal"]) == (topic_name, topic_id, False)
    assert described["partitions"] == [
        {"partition": p, "leader": 0, "leader_epoch": 0, "replicas": [0], "isr": [0]} for p in range(3)]
    assert described["configs"]["retention.ms"] == {
        "name": "retention.ms", "value": "5000", "source": "DYNAMIC_TOPIC_CONFIG", "read_only": False,
        "sensitive": False, "synonyms": []}

    altered = cli_json(bootstrap, "topics", "alter", topic_name, "--partitions", "5", "--config", "segment.ms=60000",
                       "--delete-config", "retention.ms")
    assert altered == {"name": topic_name, "partitions": 5, "overrides": {"segment.ms": "60000"},
                       "validate_only": False}

    assert cli_json(bootstrap, "topics", "delete", topic_name) == {"deleted": [topic_name]}
    assert topic_name not in {t["name"] for t in cli_json(bootstrap, "topics", "list")}


def test_topics_text_output(bootstrap, topic_name):
    proc = run_cli(bootstrap, "topics", "create", topic_name, "-p", "2")
    assert proc.returncode == 0 and proc.stdout.startswith(f"Created topic {topic_name} with 2 partitions (id ")
    lines = run_cli(bootstrap, "topics", "describe", topic_name).stdout.splitlines()
    assert lines[0].startswith(f"Topic: {topic_name}  TopicId: ") and lines[0].endswith(
        "Partitions: 2  ReplicationFactor: 1")
    assert lines[1].split() == ["PARTITION", "LEADER", "LEADER", "EPOCH", "REPLICAS", "ISR"]
    assert [line.split() for line in lines[2:]] == [["0", "0", "0", "0", "0"], ["1", "0", "0", "0", "0"]]
    table = run_cli(bootstrap, "topics", "list").stdout.splitlines()
    assert table[0].split() == ["TOPIC", "PARTITIONS", "TOPIC", "ID", "INTERNAL"]
    (row,) = [line.split() for line in table[1:] if line.split()[0] == topic_name]
    assert row[1] == "2" and row[3] == "no"


def test_topic_errors_exit_1_with_one_line(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name)
    assert cli_error(bootstrap, "topics", "create", topic_name) == (
        f"oncelog: error: TOPIC_ALREADY_EXISTS (36): Topic '{topic_name}' already exists.")
    assert cli_json(bootstrap, "topics", "create", topic_name, "--if-not-exists") == {"name": topic_name,
                                                                                      "created": False}
    assert cli_error(bootstrap, "topics", "create", topic_name + "-0", "-p", "0").startswith(
        "oncelog: error: INVALID_PARTITIONS (37): ")
    assert cli_error(bootstrap, "topics", "delete", topic_name + "-missing").startswith(
        "oncelog: error: UNKNOWN_TOPIC_OR_PARTITION (3): ")
    assert cli_json(bootstrap, "topics", "delete", topic_name + "-missing", "--if-exists") == {"deleted": []}
    assert cli_error(bootstrap, "topics", "alter", topic_name, "--config", "retention.ms=never").startswith(
        "oncelog: error: INVALID_CONFIG (40): ")
    assert cli_error(bootstrap, "topics", "alter", topic_name) == (
        "oncelog: error: nothing to alter: give --partitions, --config or --delete-config")
    assert cli_error(bootstrap, "topics", "create", topic_name + "-x", "--config", "nokey") == (
        "oncelog: error: --config expects KEY=VALUE, got 'nokey'")


def test_unreachable_broker_is_one_line(tmp_path):
    line = cli_error("127.0.0.1:1", "topics", "list", "--timeout", "2", "-X", "request.timeout.ms=1000",
                     "-X", "socket.connection.setup.timeout.ms=500")
    assert line.startswith("oncelog: error: ") and "127.0.0.1:1" in line


def test_bootstrap_from_the_environment(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name)
    proc = run_cli(None, "topics", "list", "--json", env={"ONCELOG_BOOTSTRAP": bootstrap})
    assert proc.returncode == 0, proc.stderr
    assert topic_name in {t["name"] for t in json.loads(proc.stdout)}


def test_records_delete_and_offsets(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    base = 1_700_000_000_000
    ck_produce(bootstrap, topic_name, [Out(p, None, b"%d-%d" % (p, i), (), base + i) for p in (0, 1) for i in range(4)])
    assert cli_json(bootstrap, "records", "delete", f"{topic_name}:0", "--before", "3") == [
        {"topic": topic_name, "partition": 0, "low_watermark": 3}]
    assert cli_json(bootstrap, "records", "delete", f"{topic_name}:1", "--before", "-1") == [
        {"topic": topic_name, "partition": 1, "low_watermark": 4}]
    assert cli_json(bootstrap, "records", "offsets", topic_name, "--time", "earliest") == [
        {"topic": topic_name, "partition": 0, "offset": 3, "timestamp": -1},
        {"topic": topic_name, "partition": 1, "offset": 4, "timestamp": -1}]
    assert cli_json(bootstrap, "records", "offsets", topic_name, "-p", "0", "--time", "max_timestamp") == [
        {"topic": topic_name, "partition": 0, "offset": 3, "timestamp": base + 3}]
    assert [r.value for r in ck_consume(bootstrap, topic_name, {0: 3})] == [b"0-3"]
    assert cli_error(bootstrap, "records", "delete", f"{topic_name}:0", "--before", "9").startswith(
        "oncelog: error: OFFSET_OUT_OF_RANGE (1): ")
    assert cli_error(bootstrap, "records", "delete", f"{topic_name}:7", "--before", "0") == (
        f"oncelog: error: UNKNOWN_TOPIC_OR_PARTITION (3): {topic_name}-7: Unknown topic or partition.")
    proc = run_cli(bootstrap, "records", "delete", topic_name, "--before", "0")
    assert proc.returncode == 2 and "expected TOPIC:PARTITION" in proc.stderr  # argparse's usage error


def test_producers_describe(bootstrap, topic_name):
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    ck_produce(bootstrap, topic_name, [Out(1, None, b"a"), Out(1, None, b"b")], **{"enable.idempotence": True})
    producer = ck_producer(bootstrap, **{"transactional.id": topic_name, "enable.idempotence": True})
    producer.init_transactions(20)
    producer.begin_transaction()
    producer.produce(topic_name, b"t", partition=0)
    assert producer.flush(20) == 0
    rows = cli_json(bootstrap, "producers", "describe", topic_name)
    assert [(r["partition"], r["producer_epoch"], r["last_sequence"], r["current_txn_start_offset"]) for r in rows] == [
        (0, 0, 0, 0), (1, 0, 1, None)]
    only = cli_json(bootstrap, "producers", "describe", topic_name, "-p", "1")
    assert only == [rows[1]]
    assert set(rows[0]) == {"topic", "partition", "producer_id", "producer_epoch", "last_sequence", "last_timestamp",
                            "coordinator_epoch", "current_txn_start_offset"}
    text = run_cli(bootstrap, "producers", "describe", topic_name, "-p", "0").stdout.splitlines()
    assert len(text) == 2 and text[1].split()[0] == "0" and text[1].split()[-1] == "0"
    producer.abort_transaction(20)
    assert cli_error(bootstrap, "producers", "describe", topic_name + "-missing").startswith(
        "oncelog: error: UNKNOWN_TOPIC_OR_PARTITION (3): ")


def test_serve_still_starts_a_broker(module_broker):
    """The fixture's broker runs `oncelog serve`; the client commands must not have changed it."""
    proc = run_cli(None, "serve", "--help")
    assert proc.returncode == 0 and "--data-dir" in proc.stdout and "--metrics-listen" in proc.stdout
    assert module_broker.alive()
