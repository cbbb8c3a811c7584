"""`oncelog transactions list|describe|find-hanging|abort` end to end: a transaction left open by a killed
confluent-kafka producer whose coordinator state is then lost is found by find-hanging, aborted by abort,
and the last stable offset advances (read_committed readers get past it)."""

from __future__ import annotations

import time

from tests.integration.client.admin_support import (
    cli_error,
    cli_json,
    lose_transaction_state,
    open_transaction_then_kill,
    run_cli,
)
from tests.integration.helpers import Out, ck_consume, ck_produce, ck_producer


def test_list_and_describe(module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    cli_json(bootstrap, "topics", "create", topic_name)
    producer = ck_producer(bootstrap, **{"transactional.id": topic_name, "enable.idempotence": True,
                                         "transaction.timeout.ms": 50000})
    producer.init_transactions(20)
    producer.begin_transaction()
    producer.produce(topic_name, b"x", partition=0)
    assert producer.flush(20) == 0

    described = cli_json(bootstrap, "transactions", "describe", topic_name)
    pid = described["producer_id"]
    assert {k: v for k, v in described.items() if k not in ("producer_id", "start_time_ms")} == {
        "transactional_id": topic_name, "coordinator_id": 0, "state": "Ongoing", "producer_epoch": 0,
        "timeout_ms": 50000, "partitions": [[topic_name, 0]]}
    assert described["start_time_ms"] > 0
    listed = cli_json(bootstrap, "transactions", "list", "--producer-id", str(pid))
    assert listed == [{"transactional_id": topic_name, "producer_id": pid, "state": "Ongoing"}]
    assert cli_json(bootstrap, "transactions", "list", "--producer-id", str(pid), "--state", "CompleteAbort") == []
    text = run_cli(bootstrap, "transactions", "list", "--producer-id", str(pid)).stdout.splitlines()
    assert text[0].split() == ["TRANSACTIONAL", "ID", "PRODUCER", "ID", "STATE"]
    assert text[1].split() == [topic_name, str(pid), "Ongoing"]
    producer.abort_transaction(20)
    assert cli_json(bootstrap, "transactions", "describe", topic_name)["state"] == "CompleteAbort"
    assert cli_error(bootstrap, "transactions", "describe", topic_name + "-missing") == (
        f"oncelog: error: TRANSACTIONAL_ID_NOT_FOUND (105): transactional id '{topic_name}-missing': "
        "Transactional id not found.")


def test_find_hanging_and_abort(broker_factory, topic_name):
    broker = broker_factory()
    bootstrap = broker.bootstrap
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    ck_produce(bootstrap, topic_name, [Out(1, None, b"p0"), Out(1, None, b"p1")])
    open_transaction_then_kill(bootstrap, topic_name, 1, "lost", ["t0", "t1"])

    # while the coordinator still knows the transaction it is not hanging (the coordinator will end it)
    time.sleep(0.01)
    assert cli_json(bootstrap, "transactions", "find-hanging", "--max-transaction-timeout", "0") == []

    lose_transaction_state(broker)
    ck_produce(bootstrap, topic_name, [Out(1, None, b"p4")])
    lso = [{"topic": topic_name, "partition": 1, "offset": 2, "timestamp": -1}]
    assert cli_json(bootstrap, "records", "offsets", topic_name, "-p", "1", "--isolation", "read_committed") == lso
    assert cli_json(bootstrap, "transactions", "find-hanging", "--topic", topic_name) == []  # 15 minutes not over
    time.sleep(0.01)
    (found,) = cli_json(bootstrap, "transactions", "find-hanging", "--topic", topic_name,
                        "--max-transaction-timeout", "0")
    (state,) = cli_json(bootstrap, "producers", "describe", topic_name, "-p", "1")
    assert {k: v for k, v in found.items() if k not in ("last_timestamp", "duration_ms")} == {
        "topic": topic_name, "partition": 1, "producer_id": state["producer_id"],
        "producer_epoch": state["producer_epoch"], "coordinator_epoch": -1, "start_offset": 2,
        "reason": "unknown producer id"}
    assert found["last_timestamp"] == state["last_timestamp"] and found["duration_ms"] >= 0
    text = run_cli(bootstrap, "transactions", "find-hanging", "--max-transaction-timeout", "0").stdout.splitlines()
    assert text[1].split()[:6] == [topic_name, "1", str(state["producer_id"]), str(state["producer_epoch"]), "-1",
                                   "2"]

    assert cli_error(bootstrap, "transactions", "abort", "--topic", topic_name, "--partition", "1",
                     "--start-offset", "3") == (
        f"oncelog: error: no open transaction starts at offset 3 on {topic_name}-1")
    assert cli_error(bootstrap, "transactions", "abort", "--topic", topic_name, "--partition", "1") == (
        "oncelog: error: identify the transaction with --start-offset, or with --producer-id, --producer-epoch "
        "and --coordinator-epoch")
    aborted = cli_json(bootstrap, "transactions", "abort", "--topic", topic_name, "--partition", "1",
                       "--start-offset", "2")
    assert aborted == {"topic": topic_name, "partition": 1, "producer_id": state["producer_id"],
                       "producer_epoch": state["producer_epoch"], "coordinator_epoch": -1, "aborted": True}

    # the marker went at 5: the LSO is the end of the log again and read_committed readers see no t0/t1
    assert cli_json(bootstrap, "records", "offsets", topic_name, "-p", "1", "--isolation", "read_committed") == [
        {"topic": topic_name, "partition": 1, "offset": 6, "timestamp": -1}]
    assert cli_json(bootstrap, "transactions", "find-hanging", "--max-transaction-timeout", "0") == []
    committed = ck_consume(bootstrap, topic_name, {1: 0}, **{"isolation.level": "read_committed"})
    assert [r.value for r in committed] == [b"p0", b"p1", b"p4"]


def test_abort_by_producer_id(broker_factory, topic_name):
    broker = broker_factory()
    bootstrap = broker.bootstrap
    cli_json(bootstrap, "topics", "create", topic_name)
    open_transaction_then_kill(bootstrap, topic_name, 0, "lost", ["t0"])
    lose_transaction_state(broker)
    (state,) = cli_json(bootstrap, "producers", "describe", topic_name)
    args = ["transactions", "abort", "--topic", topic_name, "--partition", "0", "--producer-id",
            str(state["producer_id"])]
    assert cli_error(bootstrap, *args) == (
        "oncelog: error: --producer-id needs --producer-epoch and --coordinator-epoch")
    stale = str(state["producer_epoch"] - 1)
    assert cli_error(bootstrap, *args, "--producer-epoch", stale, "--coordinator-epoch", "0").startswith(
        "oncelog: error: INVALID_PRODUCER_EPOCH (47): ")
    cli_json(bootstrap, *args, "--producer-epoch", str(state["producer_epoch"]), "--coordinator-epoch", "-1")
    assert cli_json(bootstrap, "records", "offsets", topic_name, "--isolation", "read_committed")[0]["offset"] == 2
