"""Kafka 4.4's own command-line tools against oncelog's secured broker (issue 23, docs/security.md).

Each tool runs as its main class (tests/support/kafka_tools.py) with a `--command-config` file written the way a
Kafka operator writes it:

- against a SecuredBroker's SASL_SSL listener as `alice` (SCRAM-SHA-512, `ssl.truststore.type=PEM`):
  kafka-topics (create, list, describe, alter), kafka-configs (a SCRAM-SHA-256 user added with `--add-config
  'SCRAM-SHA-256=[iterations=8192,password=...]'`, described, then logging in with librdkafka; deleted, then
  refused), kafka-transactions (list, describe and describe-producers of a transaction a librdkafka producer
  left open, then describe after its commit);
- against an AclBroker's SASL_PLAINTEXT listener as the super user `admin` (PLAIN): kafka-acls with the
  `--producer` / `--consumer` shortcuts for a transactional pipeline, listed by principal, exercised by the
  granted user with librdkafka, then removed.

Without java or Maven (or Maven Central unreachable the first time) every test here is skipped with the reason.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from tests.integration.helpers import Out, ck_consume, ck_produce
from tests.support.acl_broker import AclBroker
from tests.support.kafka import TlsMaterial
from tests.support.kafka_tools import (
    TOPICS,
    TRANSACTIONS,
    KafkaUnavailable,
    ToolResult,
    kafka_tool,
    tools_runtime,
)
from tests.support.secured_broker import SecuredBroker

# Out of make test's time budget (make interop-test runs it); its short sibling stays in make test.
pytestmark = pytest.mark.interop_slow

CONFIGS = "org.apache.kafka.tools.ConfigCommand"   # kafka-configs.sh
ACLS = "org.apache.kafka.tools.AclCommand"         # kafka-acls.sh
SCRAM_512 = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


@pytest.fixture(scope="module")
def tools() -> None:
    try:
        tools_runtime()
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsMaterial:
    return TlsMaterial(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def broker(tools, tmp_path_factory, tls):
    b = SecuredBroker(tmp_path_factory.mktemp("secured"), tls).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def command_config(tmp_path_factory, tls) -> Path:
    """A SASL_SSL client as Kafka's tools take it: SCRAM-SHA-512 as alice, the CA as a PEM trust store."""
    path = tmp_path_factory.mktemp("tool-config") / "sasl-ssl.properties"
    path.write_text("security.protocol=SASL_SSL\n"
                    "sasl.mechanism=SCRAM-SHA-512\n"
                    f'sasl.jaas.config={SCRAM_512} required username="alice" password="alice-secret";\n'
                    "ssl.truststore.type=PEM\n"
                    f"ssl.truststore.location={tls.ca_pem}\n")
    return path


def tool(main_class: str, broker: SecuredBroker, command_config: Path, *args: str,
         check: bool = True) -> ToolResult:
    """`main_class --bootstrap-server <SASL_SSL listener> --command-config <file> args...`."""
    return kafka_tool(main_class, "--bootstrap-server", broker.bootstrap_for("SASL_SSL"),
                      "--command-config", str(command_config), *args, check=check)


def security(conf: dict[str, str]) -> dict[str, str]:
    """A client_config() without its bootstrap.servers (the helpers take the bootstrap separately)."""
    return {k: v for k, v in conf.items() if k != "bootstrap.servers"}


def table(result: ToolResult) -> list[list[str]]:
    """A tool's table: each line's cells, stripped, the header line first. Kafka's tools end every cell with a
    tab, so an empty last cell (TopicPartitions of a transaction without partitions) is still there."""
    rows = []
    for line in result.stdout.splitlines():
        if line.strip():
            cells = line.split("\t")
            rows.append([cell.strip() for cell in (cells[:-1] if line.endswith("\t") else cells)])
    return rows


def authentication_errors(conf: dict[str, Any], timeout: float = 10.0) -> list[KafkaError]:
    """The errors librdkafka reports while it tries to connect with `conf` and send one record."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": errors.append, "message.timeout.ms": int(timeout * 1000)})
    producer.produce("never-created", b"x")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        producer.poll(0.1)
    producer.purge()
    producer.flush(1)
    return errors


def broker_log_clean(broker_process: Any, offset: int) -> None:
    text = broker_process.log_path.read_bytes()[offset:].decode(errors="replace")
    bad = [ln for ln in text.splitlines() if " ERROR " in ln or " CRITICAL " in ln or "Traceback" in ln]
    assert not bad, "broker logged errors:\n" + "\n".join(bad[:20])


# -- kafka-topics ------------------------------------------------------------------------------------------------


def test_kafka_topics_create_list_describe_alter(broker, command_config, topic_name):
    mark = broker.process.log_path.stat().st_size
    created = tool(TOPICS, broker, command_config, "--create", "--topic", topic_name, "--partitions", "3",
                   "--replication-factor", "1", "--config", "retention.ms=3600000",
                   "--config", "cleanup.policy=delete")
    assert created.lines() == [f"Created topic {topic_name}."]
    assert topic_name in tool(TOPICS, broker, command_config, "--list").lines()

    described = tool(TOPICS, broker, command_config, "--describe", "--topic", topic_name)
    header = next(ln for ln in described.lines() if ln.startswith(f"Topic: {topic_name}\tTopicId:"))
    assert "PartitionCount: 3" in header and "ReplicationFactor: 1" in header, described.stdout
    assert "retention.ms=3600000" in header and "cleanup.policy=delete" in header, described.stdout
    partitions = [ln for ln in described.lines() if ln.startswith(f"Topic: {topic_name}\tPartition:")]
    assert [ln.split("\t")[1:4] for ln in partitions] == [
        [f"Partition: {p}", "Leader: 0", "Replicas: 0"] for p in range(3)], described.stdout

    tool(TOPICS, broker, command_config, "--alter", "--topic", topic_name, "--partitions", "5")
    described = tool(TOPICS, broker, command_config, "--describe", "--topic", topic_name)
    assert "PartitionCount: 5" in described.stdout, described.stdout

    duplicate = tool(TOPICS, broker, command_config, "--create", "--topic", topic_name, "--partitions", "1",
                     check=False)
    assert not duplicate.ok and "TopicExistsException" in duplicate.stdout + duplicate.stderr
    broker_log_clean(broker.process, mark)


# -- kafka-configs: SCRAM users -------------------------------------------------------------------------------


def test_kafka_configs_adds_a_scram_user_who_then_logs_in(broker, command_config, topic_name):
    mark = broker.process.log_path.stat().st_size
    user = f"bob-{uuid.uuid4().hex[:6]}"
    password = "bob-secret"
    entity = ("--entity-type", "users", "--entity-name", user)
    added = tool(CONFIGS, broker, command_config, "--alter", "--add-config",
                 f"SCRAM-SHA-256=[iterations=8192,password={password}]", *entity)
    assert added.lines() == [f"Completed updating config for user {user}."], added.stdout

    described = tool(CONFIGS, broker, command_config, "--describe", *entity)
    assert described.lines() == [f"SCRAM credential configs for user-principal '{user}' are "
                                 "SCRAM-SHA-256=iterations=8192"], described.stdout

    # bob logs in with librdkafka over SASL_SSL with SCRAM-SHA-256: writes and reads back
    bob = security(broker.client_config("SASL_SSL", mechanism="SCRAM-SHA-256", user=user, password=password))
    bootstrap = broker.bootstrap_for("SASL_SSL")
    outs = [Out(0, f"k{i}".encode(), f"from {user} {i}".encode()) for i in range(5)]
    acked = ck_produce(bootstrap, topic_name, outs, **bob, **{"enable.idempotence": True})
    assert [offset for _, offset in acked] == list(range(5))
    assert [r.value for r in ck_consume(bootstrap, topic_name, {0: 0}, **bob)] == [o.value for o in outs]

    # only the mechanism that was added, only with its password
    for mechanism, pw in (("SCRAM-SHA-512", password), ("SCRAM-SHA-256", "not-" + password)):
        errors = authentication_errors(broker.client_config("SASL_SSL", mechanism=mechanism, user=user,
                                                            password=pw))
        auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
        assert auth and f"invalid credentials with SASL mechanism {mechanism}" in auth[0].str(), errors

    tool(CONFIGS, broker, command_config, "--alter", "--delete-config", "SCRAM-SHA-256", *entity)
    # a user without credentials is RESOURCE_NOT_FOUND in DescribeUserScramCredentials, which the Admin's users()
    # leaves out: the tool prints no line for it
    after = tool(CONFIGS, broker, command_config, "--describe", *entity)
    assert after.lines() == [], after.stdout
    errors = authentication_errors(broker.client_config("SASL_SSL", mechanism="SCRAM-SHA-256", user=user,
                                                        password=password))
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    broker_log_clean(broker.process, mark)


# -- kafka-transactions -----------------------------------------------------------------------------------------


def test_kafka_transactions_list_and_describe_an_open_transaction(broker, command_config, topic_name):
    mark = broker.process.log_path.stat().st_size
    bootstrap = broker.bootstrap_for("SASL_SSL")
    alice = security(broker.client_config("SASL_SSL", mechanism="SCRAM-SHA-512"))
    txn_id = f"{topic_name}-tx"
    ck_produce(bootstrap, topic_name, [Out(0, None, b"before")], **alice)  # offset 0, outside the transaction
    producer = Producer({"bootstrap.servers": bootstrap, **alice, "transactional.id": txn_id,
                         "transaction.timeout.ms": 120000})
    committed = False
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic_name, value=f"open-{i}".encode(), partition=0)
        assert producer.flush(30) == 0
        # ... and the transaction is left open while the tools look at it

        listed = table(tool(TRANSACTIONS, broker, command_config, "list"))
        assert listed[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"], listed
        (row,) = [r for r in listed[1:] if r[0] == txn_id]
        assert row[1] == "0" and row[3] == "Ongoing", listed
        producer_id = row[2]

        described = table(tool(TRANSACTIONS, broker, command_config, "describe", "--transactional-id", txn_id))
        assert described[0] == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                                "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                                "TopicPartitions"], described
        info = dict(zip(described[0], described[1], strict=True))
        assert info["CoordinatorId"] == "0" and info["ProducerId"] == producer_id and info["ProducerEpoch"] == "0"
        assert info["TransactionState"] == "Ongoing" and info["TransactionTimeoutMs"] == "120000", info
        assert info["TopicPartitions"] == f"{topic_name}-0", info
        assert int(info["CurrentTransactionStartTimeMs"]) > 0 and int(info["TransactionDurationMs"]) >= 0, info

        producers = table(tool(TRANSACTIONS, broker, command_config, "describe-producers", "--topic", topic_name,
                               "--partition", "0"))
        assert producers[0][:2] == ["ProducerId", "ProducerEpoch"] and "CurrentTransactionStartOffset" in producers[0]
        by_id = {r[0]: dict(zip(producers[0], r, strict=True)) for r in producers[1:]}
        assert by_id[producer_id]["CurrentTransactionStartOffset"] == "1", producers

        producer.commit_transaction(30)
        committed = True
    finally:
        if not committed:  # a failed check leaves no producer retrying against a stopped broker
            try:
                producer.abort_transaction(10)
            except KafkaException:
                pass
    described = table(tool(TRANSACTIONS, broker, command_config, "describe", "--transactional-id", txn_id))
    info = dict(zip(described[0], described[1], strict=True))
    assert info["TransactionState"] == "CompleteCommit" and info["TopicPartitions"] == "", info
    assert [r.value for r in ck_consume(bootstrap, topic_name, {0: 0}, **alice,
                                        **{"isolation.level": "read_committed"})] == [
        b"before", b"open-0", b"open-1", b"open-2"]
    broker_log_clean(broker.process, mark)


# -- kafka-acls against an ACL broker ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_broker(tools, tmp_path_factory):
    b = AclBroker(tmp_path_factory.mktemp("acl")).start()
    yield b
    b.stop()


def test_kafka_acls_grants_a_transactional_pipeline(acl_broker, tmp_path, topic_name):
    mark = acl_broker.process.log_path.stat().st_size
    admin_config = tmp_path / "admin.properties"
    admin_config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                            f'sasl.jaas.config={PLAIN} required username="admin" password="admin-secret";\n')

    def acls(*args: str, check: bool = True) -> ToolResult:
        return kafka_tool(ACLS, "--bootstrap-server", acl_broker.bootstrap, "--command-config", str(admin_config),
                          *args, check=check)

    source, sink, group, txn_id = f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-etl", f"{topic_name}-tx"
    producer_acl = ("--allow-principal", "User:alice", "--producer", "--topic", sink, "--transactional-id", txn_id)
    acls("--add", *producer_acl)
    acls("--add", "--allow-principal", "User:alice", "--consumer", "--topic", source, "--group", group)

    listed = acls("--list", "--principal", "User:alice").stdout
    expected = {
        ("TOPIC", sink): {"WRITE", "DESCRIBE", "CREATE"},
        ("TRANSACTIONAL_ID", txn_id): {"WRITE", "DESCRIBE"},
        ("TOPIC", source): {"READ", "DESCRIBE"},
        ("GROUP", group): {"READ"},
    }
    for (rtype, name), operations in expected.items():
        block = listed.split(f"resourceType={rtype}, name={name}, patternType=LITERAL", 1)
        assert len(block) == 2, f"no ACLs listed for {rtype} {name}:\n{listed}"
        entries = block[1].split("Current ACLs for", 1)[0]
        found = {op for op in ("READ", "WRITE", "DESCRIBE", "CREATE") if f"operation={op}," in entries}
        assert found == operations, f"{rtype} {name}: {found}\n{listed}"
        assert "principal=User:alice" in entries and "permissionType=ALLOW" in entries

    # admin (super user) sets up the topics and the input; alice runs the pipeline with only those ACLs
    admin = acl_broker.admin()
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic(source, 1, 1), NewTopic(sink, 1, 1)]).values():
        future.result(30)
    ck_produce(acl_broker.bootstrap, source, [Out(0, None, f"in-{i}".encode()) for i in range(4)],
               **security(acl_broker.client("admin")))
    alice = security(acl_broker.client("alice"))
    copied = copy_transactionally(acl_broker.bootstrap, alice, source, sink, group, txn_id, 4)
    assert copied == [f"in-{i}".encode() for i in range(4)]
    out = ck_consume(acl_broker.bootstrap, sink, {0: 0}, **security(acl_broker.client("admin")),
                     **{"isolation.level": "read_committed"})
    assert [r.value for r in out] == [f"in-{i}".encode() for i in range(4)]

    # bob has none of it
    with pytest.raises(KafkaException) as refused:
        copy_transactionally(acl_broker.bootstrap, security(acl_broker.client("bob")), source, sink, group, txn_id, 4)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value

    # without the producer ACLs alice can no longer initialize the transactional id
    acls("--remove", "--force", *producer_acl)
    remaining = acls("--list", "--principal", "User:alice").stdout
    assert f"name={sink}," not in remaining and f"name={txn_id}," not in remaining, remaining
    assert f"name={source}," in remaining and f"name={group}," in remaining, remaining
    with pytest.raises(KafkaException) as refused:
        copy_transactionally(acl_broker.bootstrap, alice, source, sink, group, txn_id, 4)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value
    broker_log_clean(acl_broker.process, mark)


def copy_transactionally(bootstrap: str, conf: dict[str, str], source: str, sink: str, group: str, txn_id: str,
                         count: int) -> list[bytes]:
    """Consume `count` records of `source` in `group` and write them to `sink` in one transaction that also
    commits the group's offsets; the values copied."""
    producer = Producer({"bootstrap.servers": bootstrap, **conf, "transactional.id": txn_id})
    producer.init_transactions(20)
    consumer = Consumer({"bootstrap.servers": bootstrap, **conf, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(source, 0, 0)])
        values: list[bytes] = []
        producer.begin_transaction()
        deadline = time.monotonic() + 30
        while len(values) < count:
            assert time.monotonic() < deadline, f"read {len(values)} of {count}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            values.append(msg.value())
            producer.produce(sink, value=msg.value(), partition=0)
        producer.send_offsets_to_transaction([TopicPartition(source, 0, count)], consumer.consumer_group_metadata(),
                                             20)
        producer.commit_transaction(20)
        return values
    finally:
        consumer.close()
