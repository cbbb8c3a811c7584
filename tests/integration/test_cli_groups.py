"""`oncelog groups list|describe|delete|reset-offsets` end to end, with a librdkafka consumer as the member
and as the check of where a reset put the group."""

from __future__ import annotations

import json
import time

from confluent_kafka import Consumer
from tests.integration.client.admin_support import cli_error, cli_json, run_cli
from tests.integration.helpers import Out, ck_produce, wait_until


def member(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "cli-test",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    consumer.subscribe([topic])
    return consumer


def consume(consumer: Consumer, n: int, timeout: float = 30.0) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n}"
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            out.append((msg.partition(), msg.offset()))
    return out


def state_of(bootstrap: str, group: str) -> str:
    return cli_json(bootstrap, "groups", "describe", group)["state"]


def test_groups_end_to_end(module_broker, topic_name):
    bootstrap, group = module_broker.bootstrap, topic_name + "-g"
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "2")
    ck_produce(bootstrap, topic_name, [Out(p, None, b"v") for p in (0, 1) for _ in range(5)])
    consumer = member(bootstrap, group, topic_name)
    try:
        assert len(consume(consumer, 10)) == 10
        consumer.commit(asynchronous=False)
        assert {"group_id": group, "state": "Stable", "protocol_type": "consumer"} in cli_json(
            bootstrap, "groups", "list")
        assert group not in {g["group_id"] for g in cli_json(bootstrap, "groups", "list", "--state", "Empty")}
        described = cli_json(bootstrap, "groups", "describe", group)
        (m,) = described["members"]
        assert (described["state"], m["client_id"], m["host"], m["assignment"]) == (
            "Stable", "cli-test", "/127.0.0.1", [[topic_name, 0], [topic_name, 1]])
        assert described["offsets"] == [
            {"topic": topic_name, "partition": p, "current_offset": 5, "log_end_offset": 5, "lag": 0,
             "member_id": m["member_id"], "host": "/127.0.0.1", "client_id": "cli-test"} for p in (0, 1)]
        assert cli_error(bootstrap, "groups", "reset-offsets", group, "--all-topics", "--to-earliest") == (
            f"oncelog: error: NON_EMPTY_GROUP (68): group '{group}': offsets can only be reset while the group "
            "is inactive; it is Stable")
        assert cli_error(bootstrap, "groups", "delete", group).startswith("oncelog: error: NON_EMPTY_GROUP (68)")
    finally:
        consumer.close()
    wait_until(lambda: state_of(bootstrap, group) == "Empty", what="group empty")

    plan = cli_json(bootstrap, "groups", "reset-offsets", group, "--topic", f"{topic_name}:1", "--shift-by", "-2",
                    "--dry-run")
    assert plan == {"group": group, "dry_run": True, "partitions": [
        {"topic": topic_name, "partition": 1, "current": 5, "target": 3}]}
    offsets = {o["partition"]: o["current_offset"] for o in cli_json(bootstrap, "groups", "describe",
                                                                       group)["offsets"]}
    assert offsets == {0: 5, 1: 5}  # a dry run changes nothing

    implicit = run_cli(bootstrap, "groups", "reset-offsets", group, "--all-topics", "--to-offset", "2", "--json")
    assert implicit.returncode == 0, implicit.stderr
    assert json.loads(implicit.stdout)["dry_run"] is True  # Kafka's rule: no --execute, no change
    assert "add --execute to reset the offsets" in implicit.stderr
    offsets = {o["partition"]: o["current_offset"] for o in cli_json(bootstrap, "groups", "describe",
                                                                       group)["offsets"]}
    assert offsets == {0: 5, 1: 5}
    both = run_cli(bootstrap, "groups", "reset-offsets", group, "--all-topics", "--to-offset", "2", "--dry-run",
                   "--execute")
    assert both.returncode == 2 and "argument --execute: not allowed with argument --dry-run" in both.stderr

    done = cli_json(bootstrap, "groups", "reset-offsets", group, "--all-topics", "--to-offset", "2", "--execute")
    assert done["dry_run"] is False
    assert [(r["partition"], r["current"], r["target"]) for r in done["partitions"]] == [(0, 5, 2), (1, 5, 2)]
    described = cli_json(bootstrap, "groups", "describe", group)
    assert [(o["partition"], o["current_offset"], o["lag"]) for o in described["offsets"]] == [(0, 2, 3), (1, 2, 3)]
    consumer = member(bootstrap, group, topic_name)  # the group goes on from the reset offsets
    try:
        assert sorted(consume(consumer, 6)) == [(p, o) for p in (0, 1) for o in (2, 3, 4)]
    finally:
        consumer.close()
    wait_until(lambda: state_of(bootstrap, group) == "Empty", what="group empty")

    latest = cli_json(bootstrap, "groups", "reset-offsets", group, "--topic", topic_name, "--to-latest",
                      "--execute")
    assert [r["target"] for r in latest["partitions"]] == [5, 5]
    earliest = cli_json(bootstrap, "groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest",
                        "--execute")
    assert [r["target"] for r in earliest["partitions"]] == [0, 0]

    assert cli_json(bootstrap, "groups", "delete", group) == {"deleted": [group]}
    assert group not in {g["group_id"] for g in cli_json(bootstrap, "groups", "list")}
    assert cli_error(bootstrap, "groups", "describe", group) == f"oncelog: error: group '{group}' does not exist"
    assert cli_error(bootstrap, "groups", "delete", group).startswith("oncelog: error: GROUP_ID_NOT_FOUND (69)")


def test_reset_with_progress_and_text(module_broker, topic_name):
    bootstrap, group = module_broker.bootstrap, topic_name + "-g"
    cli_json(bootstrap, "topics", "create", topic_name, "-p", "3")
    proc = run_cli(bootstrap, "groups", "reset-offsets", group, "--topic", topic_name, "--to-latest", "--progress",
                   "--execute")
    assert proc.returncode == 0, proc.stderr
    assert f"resetting {group} [" in proc.stderr and "100.0% 3/3 partitions" in proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert rows == [["TOPIC", "PARTITION", "CURRENT", "OFFSET", "NEW", "OFFSET"]] + [
        [topic_name, str(p), "-", "0"] for p in range(3)]
    text = run_cli(bootstrap, "groups", "describe", group).stdout.splitlines()
    assert text[0] == f"Group: {group}  State: Empty  Protocol: -/-  Coordinator: 0  Members: 0"
    assert cli_error(bootstrap, "groups", "reset-offsets", group + "-new", "--all-topics", "--to-latest", "--execute") == (
        f"oncelog: error: group '{group}-new' has no committed offsets; name the partitions with --topic")
