"""The transaction manager's state machine without a broker: which errors make a transaction abortable, which
end the producer, and what each state allows."""

from __future__ import annotations

import asyncio

import pytest

from oncelog.client.config import ClientConfig
from oncelog.client.errors import AbortableError, FatalError, KafkaError, ProducerFenced, error_for
from oncelog.client.producer.idempotence import Idempotence, Identity
from oncelog.client.producer.transactions import State, TransactionManager, _for_version, _group_fields
from oncelog.client.types import ConsumerGroupMetadata


def manager(state: State = State.IN_TRANSACTION) -> TransactionManager:
    config = ClientConfig({"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t"}, "producer")
    idem = Idempotence()
    idem.set_identity(Identity(7, 3))
    txn = TransactionManager(config=config, cluster=None, idempotence=idem, wake=lambda: None)  # type: ignore[arg-type]
    txn.state = state
    return txn


def test_produce_needs_an_open_transaction():
    txn = manager(State.READY)
    with pytest.raises(KafkaError, match="open transaction"):
        txn.check_produce()
    manager(State.IN_TRANSACTION).check_produce()


def test_a_failed_batch_makes_the_transaction_abortable_and_commit_refuses():
    txn = manager()
    txn.batch_failed(error_for(87, "bad record", transactional=True))
    assert txn.state == State.ABORTABLE_ERROR and txn.in_error()
    with pytest.raises(AbortableError):
        txn.check_produce()

    async def commit():
        await txn.commit(lambda deadline: asyncio.sleep(0, True), 1.0)

    with pytest.raises(AbortableError, match="bad record"):
        asyncio.run(commit())
    # the first error is the one reported, later ones do not replace it
    txn.batch_failed(AbortableError("later"))
    assert "bad record" in str(txn.last_error)


def test_non_abortable_errors_still_end_the_transaction_abortably():
    txn = manager()
    txn.batch_failed(KafkaError("plain", 10))
    assert txn.state == State.ABORTABLE_ERROR and isinstance(txn.last_error, AbortableError)
    assert txn.last_error.code == 10


@pytest.mark.parametrize("code", [90, 49, 53])
def test_fencing_and_id_mapping_are_fatal(code):
    txn = manager()
    txn.batch_failed(error_for(code, coordinator=True, transactional=True))
    assert txn.state == State.FATAL_ERROR
    with pytest.raises(FatalError):
        txn.check_usable()
    txn.batch_failed(AbortableError("too late"))  # nothing leaves the fatal state
    assert txn.state == State.FATAL_ERROR


def test_invalid_producer_epoch_from_a_coordinator_is_fencing():
    assert isinstance(error_for(47, coordinator=True, transactional=True), ProducerFenced)
    assert isinstance(error_for(47, transactional=True), AbortableError)  # on Produce: abortable (KAFKA-9803)


def test_sequence_exhaustion_inside_a_transaction_is_abortable():
    txn = manager()
    txn.sequence_exhausted()
    assert txn.state == State.ABORTABLE_ERROR


def test_request_fields_follow_the_version():
    data = {"transactional_id": "t", "transaction_timeout_ms": 1, "producer_id": 7, "producer_epoch": 3}
    assert "producer_id" not in _for_version(data, 2, 22)
    assert _for_version(data, 3, 22)["producer_epoch"] == 3
    commit = {"generation_id": 4, "member_id": "m", "group_instance_id": None,
              "topics": [{"name": "x", "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                        "committed_leader_epoch": -1}]}]}
    old = _for_version(commit, 1)
    assert "generation_id" not in old and "committed_leader_epoch" not in old["topics"][0]["partitions"][0]


def test_group_metadata_or_a_plain_group_id():
    assert _group_fields("g") == ("g", -1, "", None)
    assert _group_fields(ConsumerGroupMetadata("g", 5, "member-1", "static")) == ("g", 5, "member-1", "static")
    with pytest.raises(KafkaError):
        _group_fields(object())
