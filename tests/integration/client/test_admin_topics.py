"""Admin: topics, partitions and configs against a real broker, with the exact error codes.

confluent-kafka's admin client (librdkafka, an independent implementation) checks what ours did.
"""

from __future__ import annotations

import asyncio

import pytest
from tests.integration.helpers import admin as ck_admin

from oncelog.client.admin import Admin, AsyncAdmin
from oncelog.client.errors import KafkaError, NetworkError, RetriableError
from oncelog.client.types import TopicPartition


@pytest.fixture(scope="module")
def admin(module_broker):
    client = Admin({"bootstrap.servers": module_broker.bootstrap}, api_timeout=20)
    yield client
    client.close()


def code_of(call, *args, **kwargs) -> int:
    with pytest.raises(KafkaError) as info:
        call(*args, **kwargs)
    return info.value.code


def test_create_list_describe_delete(admin, module_broker, topic_name):
    created = admin.create_topic(topic_name, 3, configs={"retention.ms": "123456", "cleanup.policy": "compact"})
    assert (created.name, created.num_partitions, created.replication_factor) == (topic_name, 3, 1)
    assert created.configs["retention.ms"] == "123456" and created.configs["cleanup.policy"] == "compact"
    assert created.configs["segment.bytes"] == "1073741824"  # defaults come back too (CreateTopics v5+)
    assert created.topic_id is not None and len(created.topic_id) == 22

    listed = {t.name: t for t in admin.list_topics()}
    assert listed[topic_name].as_dict() == {"name": topic_name, "topic_id": created.topic_id, "internal": False,
                                            "partitions": 3}
    described = admin.describe_topic(topic_name, include_configs=True)
    assert described.topic_id == created.topic_id and not described.internal
    assert [(p.partition, p.leader, p.replicas, p.isr) for p in described.partitions] == [
        (0, 0, (0,), (0,)), (1, 0, (0,), (0,)), (2, 0, (0,), (0,))]
    overrides = {c.name: c.value for c in described.configs.values() if c.source == "DYNAMIC_TOPIC_CONFIG"}
    assert overrides == {"retention.ms": "123456", "cleanup.policy": "compact"}
    assert described.configs["segment.ms"].source == "DEFAULT_CONFIG"

    meta = ck_admin(module_broker.bootstrap).list_topics(topic_name, timeout=10)
    assert sorted(meta.topics[topic_name].partitions) == [0, 1, 2]

    admin.delete_topic(topic_name)
    assert topic_name not in {t.name for t in admin.list_topics()}
    with pytest.raises(RetriableError) as info:
        admin.describe_topic(topic_name)
    assert info.value.code == 3


def test_topic_error_codes(admin, topic_name):
    admin.create_topic(topic_name, 2)
    assert code_of(admin.create_topic, topic_name, 2) == 36  # TOPIC_ALREADY_EXISTS
    assert code_of(admin.create_topic, topic_name + "-zero", 0) == 37  # INVALID_PARTITIONS
    assert code_of(admin.create_topic, topic_name + "-rf", 1, 3) == 38  # INVALID_REPLICATION_FACTOR
    assert code_of(admin.create_topic, "bad name!", 1) == 17  # INVALID_TOPIC_EXCEPTION
    assert code_of(admin.create_topic, topic_name + "-cfg", 1, configs={"retention.ms": "soon"}) == 40
    assert code_of(admin.create_topic, topic_name + "-key", 1, configs={"no.such.key": "1"}) == 40
    assert code_of(admin.delete_topic, topic_name + "-missing") == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert code_of(admin.create_partitions, topic_name, 2) == 37
    assert code_of(admin.create_partitions, topic_name, 1) == 37
    assert code_of(admin.create_partitions, topic_name + "-missing", 4) == 3
    assert code_of(admin.describe_topic_configs, topic_name + "-missing") == 3
    assert code_of(admin.alter_topic_configs, topic_name, set={"no.such.key": "1"}) == 40
    assert code_of(admin.alter_topic_configs, topic_name, set={"retention.ms": "x"}) == 40
    assert code_of(admin.alter_topic_configs, topic_name + "-missing", set={"retention.ms": "1"}) == 3
    # none of the failed calls left anything behind
    names = {t.name for t in admin.list_topics()}
    assert {n for n in names if n.startswith(topic_name)} == {topic_name}
    assert len(admin.describe_topic(topic_name).partitions) == 2


def test_error_messages_name_the_item(admin, topic_name):
    admin.create_topic(topic_name, 1)
    with pytest.raises(KafkaError) as info:
        admin.create_topic(topic_name, 1)
    assert info.value.name == "TOPIC_ALREADY_EXISTS"
    assert str(info.value) == f"TOPIC_ALREADY_EXISTS (36): Topic '{topic_name}' already exists."
    with pytest.raises(KafkaError) as info:
        admin.list_offsets({(topic_name, 7): "latest"})
    assert str(info.value) == f"UNKNOWN_TOPIC_OR_PARTITION (3): {topic_name}-7: Unknown topic or partition."


def test_validate_only_creates_nothing(admin, topic_name):
    checked = admin.create_topic(topic_name, 4, validate_only=True)
    assert (checked.num_partitions, checked.topic_id) == (4, None)
    assert topic_name not in {t.name for t in admin.list_topics()}
    admin.create_topic(topic_name, 1)
    admin.create_partitions(topic_name, 3, validate_only=True)
    assert len(admin.describe_topic(topic_name).partitions) == 1
    admin.alter_topic_configs(topic_name, set={"retention.ms": "1000"}, validate_only=True)
    assert admin.describe_topic_configs(topic_name, ["retention.ms"])["retention.ms"].source == "DEFAULT_CONFIG"


def test_create_partitions_grows_the_topic(admin, module_broker, topic_name):
    admin.create_topic(topic_name, 2)
    admin.create_partitions(topic_name, 5)
    assert [p.partition for p in admin.describe_topic(topic_name).partitions] == [0, 1, 2, 3, 4]
    offsets = admin.list_offsets({(topic_name, p): "latest" for p in range(5)})
    assert [o.offset for o in offsets.values()] == [0] * 5
    meta = ck_admin(module_broker.bootstrap).list_topics(topic_name, timeout=10)
    assert sorted(meta.topics[topic_name].partitions) == [0, 1, 2, 3, 4]


def test_incremental_alter_configs(admin, topic_name):
    admin.create_topic(topic_name, 1, configs={"retention.ms": "5000"})
    admin.alter_topic_configs(topic_name, set={"segment.ms": "60000"}, delete=["retention.ms"])
    configs = admin.describe_topic_configs(topic_name, synonyms=True)
    assert (configs["segment.ms"].value, configs["segment.ms"].source) == ("60000", "DYNAMIC_TOPIC_CONFIG")
    assert configs["segment.ms"].synonyms[0] == ("segment.ms", "60000", "DYNAMIC_TOPIC_CONFIG")
    assert configs["retention.ms"].source == "DEFAULT_CONFIG" and configs["retention.ms"].value == "604800000"
    # list configs: APPEND and SUBTRACT
    admin.alter_topic_configs(topic_name, append={"cleanup.policy": "compact"})
    assert admin.describe_topic_configs(topic_name, ["cleanup.policy"])["cleanup.policy"].value == "delete,compact"
    admin.alter_topic_configs(topic_name, subtract={"cleanup.policy": "delete"})
    assert admin.describe_topic_configs(topic_name, ["cleanup.policy"])["cleanup.policy"].value == "compact"
    assert code_of(admin.alter_topic_configs, topic_name, append={"retention.ms": "1"}) == 40  # not a list


def test_broker_configs_are_read_only(admin):
    configs = admin.describe_broker_configs()
    assert configs["num.partitions"].read_only
    assert configs["num.partitions"].value == "1"
    assert set(admin.describe_broker_configs(0, ["num.partitions"])) == {"num.partitions"}


def test_describe_cluster(admin, module_broker):
    cluster = admin.describe_cluster()
    port = int(module_broker.bootstrap.rsplit(":", 1)[1])
    assert cluster.brokers == ((0, "127.0.0.1", port),) and cluster.controller_id == 0
    assert cluster.cluster_id


def test_internal_topics_are_listed_only_on_request(admin, module_broker, topic_name):
    from tests.integration.helpers import ck_producer

    admin.create_topic(topic_name, 1)
    producer = ck_producer(module_broker.bootstrap, **{"transactional.id": topic_name, "enable.idempotence": True})
    producer.init_transactions(20)  # creates __transaction_state
    names = {t.name for t in admin.list_topics()}
    internal = {t.name: t for t in admin.list_topics(include_internal=True)}
    assert "__transaction_state" not in names and internal["__transaction_state"].internal
    assert code_of(admin.delete_topic, "__transaction_state") == 17



def test_async_admin_on_the_callers_loop(module_broker, topic_name):
    async def main() -> tuple[int, int, bool, int]:
        async with AsyncAdmin({"bootstrap.servers": module_broker.bootstrap}, api_timeout=20) as admin:
            created = await admin.create_topic(topic_name, 2)
            described, listed = await asyncio.gather(admin.describe_topic(topic_name), admin.list_topics())
            with pytest.raises(KafkaError) as info:
                await admin.create_topic(topic_name, 2)
            return (created.num_partitions, len(described.partitions), topic_name in {t.name for t in listed},
                    info.value.code)

    assert asyncio.run(main()) == (2, 2, True, 36)


def test_describe_several_topics_with_configs(admin, topic_name):
    admin.create_topic(topic_name + "-a", 1, configs={"retention.ms": "1000"})
    admin.create_topic(topic_name + "-b", 2)
    both = admin.describe_topics([topic_name + "-b", topic_name + "-a"], include_configs=True)
    assert list(both) == [topic_name + "-b", topic_name + "-a"]  # in the order asked
    assert [len(d.partitions) for d in both.values()] == [2, 1]
    assert [d.configs["retention.ms"].value for d in both.values()] == ["604800000", "1000"]
    assert code_of(admin.describe_topics, [topic_name + "-a", topic_name + "-missing"]) == 3


def test_admin_goes_on_after_a_broker_restart(broker_factory, topic_name):
    broker = broker_factory()
    client = Admin({"bootstrap.servers": broker.bootstrap, "reconnect.backoff.max.ms": 200}, api_timeout=3)
    try:
        client.create_topic(topic_name, 2)
        client.alter_group_offsets("g", {(topic_name, 1): 7})
        broker.restart()  # SIGKILL and start again on the same port: every connection is gone
        assert [t.name for t in client.list_topics()] == [topic_name]
        assert client.list_offsets({(topic_name, 1): "latest"})[TopicPartition(topic_name, 1)].offset == 0
        assert client.list_group_offsets("g")[TopicPartition(topic_name, 1)].offset == 7
        broker.kill()
        with pytest.raises(NetworkError):  # retried until api_timeout, then the network error itself
            client.list_topics()
        broker.start()
        assert client.describe_group("g").state == "Empty"
    finally:
        client.close()
