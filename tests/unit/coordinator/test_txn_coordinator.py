"""The transaction coordinator driven directly, on a real in-process broker (storage and all, no sockets
used): epoch exhaustion and producer id rotation, the reaper's fence with the owner's epoch remembered,
PrepareCommit/PrepareAbort finished at startup, transactional id expiry, verification and listing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from oncelog.broker.server import Broker
from oncelog.config import load_broker_config
from oncelog.coordinator.txn.coordinator import TransactionCoordinator
from oncelog.coordinator.txn.metadata import TxnState
from oncelog.records.batch import read_header
from oncelog.records.builder import build_batch

NONE = 0
NOT_COORDINATOR = 16
INVALID_PRODUCER_EPOCH = 47
UNKNOWN_PRODUCER_ID = 59
INVALID_TXN_STATE = 48
CONCURRENT_TRANSACTIONS = 51
PRODUCER_FENCED = 90
TRANSACTION_ABORTABLE = 120
EXHAUSTED = 32766
TOPIC = "t"


class Node:
    """An in-process broker on a data dir that can be stopped and started again."""

    def __init__(self, data_dir: Path, settings: dict[str, Any] | None = None) -> None:
        self.data_dir = data_dir
        self.settings = {
            "oncelog.fsync.enable": "false",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 3_600_000,
            **(settings or {}),
        }
        self.broker: Broker | None = None

    async def start(self) -> TransactionCoordinator:
        config = load_broker_config(overrides=[f"{k}={v}" for k, v in self.settings.items()])
        self.broker = Broker(config, self.data_dir, port=0)
        await self.broker.start()
        if TOPIC not in self.broker.logs.topics:
            self.broker.logs.create_topic(TOPIC, 2)
            self.broker.logs.set_verify_transaction(self.broker.txn_coordinator.verify_partition)
        return self.broker.txn_coordinator

    async def stop(self) -> None:
        await self.broker.stop()

    async def restart(self) -> TransactionCoordinator:
        await self.stop()
        return await self.start()

    def partition(self, index: int = 0) -> Any:
        return self.broker.logs.get_partition(TOPIC, index)

    def append(self, txn_id: str, pid: int, epoch: int, seq: int, index: int = 0, values=(b"v",)) -> Any:
        buf = build_batch(
            [(None, v) for v in values],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=True,
        )
        return self.partition(index).append_records(
            buf, read_header(buf), int(time.time() * 1000), False, txn_id
        )


def run(
    tmp_path: Path,
    body: Callable[[Node, TransactionCoordinator], Awaitable[None]],
    settings: dict[str, Any] | None = None,
) -> None:
    async def main() -> None:
        node = Node(tmp_path / "data", settings)
        coordinator = await node.start()
        try:
            await body(node, coordinator)
        finally:
            await node.stop()

    asyncio.run(main())


async def set_epoch(c: TransactionCoordinator, txn_id: str, epoch: int) -> None:
    meta = c.txns[txn_id]
    target = meta.copy()
    target.producer_epoch = epoch
    assert await c._transition(meta, target) == NONE


async def init(
    c: TransactionCoordinator, txn_id: str, pid: int = -1, epoch: int = -1, timeout_ms: int = 60000
) -> tuple[int, int, int]:
    r = await c.init_producer_id(txn_id, timeout_ms, pid, epoch, 4)
    return int(r.error), r.producer_id, r.producer_epoch


async def wait_state(c: TransactionCoordinator, txn_id: str, state: TxnState, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while c.txns[txn_id].state != state or c.txns[txn_id].pending:
        assert time.monotonic() < deadline, f"{txn_id} stayed {c.txns[txn_id].state.display}"
        await asyncio.sleep(0.01)


# -- epoch exhaustion -------------------------------------------------------------------------------------


def test_exhausted_epoch_rotates_the_producer_id_and_the_retry_survives_a_restart(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        await set_epoch(c, "x", EXHAUSTED - 1)
        assert await init(c, "x", pid, EXHAUSTED - 1) == (NONE, pid, EXHAUSTED)
        error, new_pid, epoch = await init(c, "x", pid, EXHAUSTED)
        assert (error, epoch) == (NONE, 0) and new_pid != pid
        meta = c.txns["x"]
        assert (meta.previous_producer_id, meta.last_producer_epoch) == (pid, EXHAUSTED)
        assert await init(c, "x", pid, EXHAUSTED) == (NONE, new_pid, 0)
        c = await node.restart()
        meta = c.txns["x"]
        assert (
            meta.producer_id,
            meta.producer_epoch,
            meta.previous_producer_id,
            meta.last_producer_epoch,
        ) == (new_pid, 0, pid, EXHAUSTED)
        assert await init(c, "x", pid, EXHAUSTED) == (NONE, new_pid, 0)
        assert await init(c, "x", new_pid, 0) == (NONE, new_pid, 1)
        # The new pid moved on: the old rotation's retry no longer matches the last epoch.
        assert await init(c, "x", pid, EXHAUSTED) == (PRODUCER_FENCED, -1, -1)

    run(tmp_path, body)


def test_rotation_by_a_new_instance_fences_the_holder_of_the_old_pid(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        await set_epoch(c, "x", EXHAUSTED)
        error, new_pid, epoch = await init(c, "x")  # a new instance, no pid/epoch
        assert (error, epoch) == (NONE, 0) and new_pid != pid
        assert c.txns["x"].last_producer_epoch == -1
        assert await init(c, "x", pid, EXHAUSTED) == (PRODUCER_FENCED, -1, -1)

    run(tmp_path, body)


def test_bump_without_epoch_at_32765_hands_out_32766_then_rotates(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        await set_epoch(c, "x", EXHAUSTED - 1)
        assert await init(c, "x") == (NONE, pid, EXHAUSTED)
        error, new_pid, epoch = await init(c, "x")
        assert (error, epoch) == (NONE, 0) and new_pid != pid

    run(tmp_path, body)


def test_fence_of_an_ongoing_transaction_at_32766_then_a_new_pid(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        await set_epoch(c, "x", EXHAUSTED)
        assert await c.add_partitions("x", pid, EXHAUSTED, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        assert node.append("x", pid, EXHAUSTED, 0).error == NONE
        assert await init(c, "x") == (CONCURRENT_TRANSACTIONS, -1, -1)
        await wait_state(c, "x", TxnState.COMPLETE_ABORT)
        assert c.txns["x"].producer_epoch == 32767  # the fence uses the reserved epoch ...
        error, new_pid, epoch = await init(c, "x")
        assert (error, epoch) == (NONE, 0) and new_pid != pid  # ... and never hands it out
        assert node.partition().last_stable_offset == node.partition().log.high_watermark

    run(tmp_path, body)


def test_timeout_at_32766_recovers_without_handing_out_32767(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        await set_epoch(c, "x", EXHAUSTED)
        assert await c.add_partitions("x", pid, EXHAUSTED, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        c.txns["x"].start_ms -= 120_000
        assert await c.abort_timed_out() == 1
        assert c.txns["x"].producer_epoch == 32767
        assert await c.end_txn("x", pid, EXHAUSTED, False, 3) == NONE
        error, new_pid, epoch = await init(c, "x", pid, EXHAUSTED)
        assert error == NONE
        assert epoch != 32767, "handed out the reserved epoch"
        assert (new_pid, epoch) != (pid, EXHAUSTED)

    run(tmp_path, body)


# -- the reaper -------------------------------------------------------------------------------------------


def test_reaper_fences_and_remembers_the_owners_epoch(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x", timeout_ms=1000)
        assert await c.add_partitions("x", pid, 0, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        first = node.append("x", pid, 0, 0).base_offset
        assert await c.abort_timed_out() == 0  # not yet
        c.txns["x"].start_ms -= 2000
        assert await c.abort_timed_out() == 1
        meta = c.txns["x"]
        assert (meta.state, meta.producer_epoch, meta.last_producer_epoch, meta.timed_out) == (
            TxnState.COMPLETE_ABORT,
            1,
            0,
            True,
        )
        assert c.stats["timed_out"] == 1
        part = node.partition()
        assert part.last_stable_offset == part.log.high_watermark == first + 2
        assert part.aborted_transactions(0, part.log.high_watermark) == [(pid, first)]
        # The owner's late batch: refused as INVALID_PRODUCER_EPOCH by the partition, flagged as the owner's.
        assert node.append("x", pid, 0, 1).error == INVALID_PRODUCER_EPOCH
        code, message = c.stale_epoch_answer(pid, 0, "librdkafka")
        assert code == UNKNOWN_PRODUCER_ID and "timed out" in message
        assert c.stale_epoch_answer(pid, 0, "apache-kafka-java")[0] == INVALID_PRODUCER_EPOCH
        assert c.stale_epoch_answer(pid, 1, None) is None
        # It survives a restart (last epoch persisted) and the owner resumes.
        c = await node.restart()
        assert c.txns["x"].last_producer_epoch == 0
        assert await c.end_txn("x", pid, 0, False, 3) == NONE
        assert await init(c, "x", pid, 0, timeout_ms=1000) == (NONE, pid, 1)

    run(tmp_path, body)


def test_reaper_aborts_a_transaction_that_wrote_nothing(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x", timeout_ms=1000)
        assert await c.add_partitions("x", pid, 0, [(TOPIC, 1)], 3) == {(TOPIC, 1): NONE}
        c.txns["x"].start_ms -= 5000
        assert await c.abort_timed_out() == 1
        assert c.txns["x"].state == TxnState.COMPLETE_ABORT
        assert c.txns["x"].producer_epoch == 1

    run(tmp_path, body)


def test_reaper_runs_on_its_interval(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x", timeout_ms=200)
        assert await c.add_partitions("x", pid, 0, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        await wait_state(c, "x", TxnState.COMPLETE_ABORT, timeout=5)

    run(tmp_path, body, {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 100})


# -- unfinished transactions at startup -------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_prepared_transaction_is_completed_at_startup(tmp_path, commit):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        assert await c.add_partitions("x", pid, 0, [(TOPIC, 0), (TOPIC, 1)], 3) == {
            (TOPIC, 0): NONE,
            (TOPIC, 1): NONE,
        }
        first = node.append("x", pid, 0, 0, values=(b"a", b"b")).base_offset
        assert node.append("x", pid, 0, 0, index=1).error == NONE
        # The coordinator "stops" right after persisting PrepareX: markers never written.
        target = c.txns["x"].copy()
        target.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        assert await c._persist(target) == NONE
        assert node.partition().last_stable_offset == first
        c = await node.restart()
        await wait_state(c, "x", TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
        for index in (0, 1):
            part = node.partition(index)
            assert part.last_stable_offset == part.log.high_watermark
        aborted = node.partition(0).aborted_transactions(0, 100)
        assert aborted == ([] if commit else [(pid, first)])
        assert await c.end_txn("x", pid, 0, commit, 3) == NONE  # the client's retry
        assert await c.end_txn("x", pid, 0, not commit, 3) == INVALID_TXN_STATE

    run(tmp_path, body)


# -- transactional id expiry ------------------------------------------------------------------------------


def test_idle_transactional_ids_expire_and_stay_expired_after_a_restart(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "idle")
        _, opid, _ = await init(c, "open")
        assert await c.add_partitions("open", opid, 0, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        await asyncio.sleep(0.3)
        assert await c.expire_ids() == 1
        assert "idle" not in c.txns and "open" in c.txns  # an ongoing transaction never expires
        c = await node.restart()
        assert "idle" not in c.txns
        error, new_pid, epoch = await init(c, "idle")
        assert (error, epoch) == (NONE, 0) and new_pid not in (pid, opid)
        # The old instance's bump: the id is new, so it gets the fresh pid (research §4.2, meta.epoch == -1)
        # rather than being fenced -- and its coordinator requests with the old pid are refused.
        assert int(await c.end_txn("idle", pid, 0, True, 3)) == 49

    run(tmp_path, body, {"transactional.id.expiration.ms": 200})


# -- verification and operations --------------------------------------------------------------------------


def test_verify_partition_answers(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        assert c.verify_partition("x", pid, 0, TOPIC, 0)[0] == TRANSACTION_ABORTABLE  # Empty
        assert await c.add_partitions("x", pid, 0, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        assert c.verify_partition("x", pid, 0, TOPIC, 0) == (NONE, None)
        assert c.verify_partition("x", pid, 0, TOPIC, 1)[0] == TRANSACTION_ABORTABLE
        assert c.verify_partition("x", pid + 1, 0, TOPIC, 0)[0] == TRANSACTION_ABORTABLE
        assert c.verify_partition("y", pid, 0, TOPIC, 0)[0] == TRANSACTION_ABORTABLE
        assert c.verify_partition(None, pid, 0, TOPIC, 0)[0] == TRANSACTION_ABORTABLE
        assert c.verify_partition("x", pid, 3, TOPIC, 0)[0] == INVALID_PRODUCER_EPOCH

    run(tmp_path, body)


def test_list_transactions_filters(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pa, _ = await init(c, "a")
        assert await c.add_partitions("a", pa, 0, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        _, pb, _ = await init(c, "b")
        names = lambda result: sorted(t["transactional_id"] for t in result[1])  # noqa: E731
        assert names(c.list_transactions([], [])) == ["a", "b"]
        assert names(c.list_transactions(["Ongoing"], [])) == ["a"]
        assert names(c.list_transactions([], [pb])) == ["b"]
        assert c.list_transactions(["Nope"], [])[0] == ["Nope"]
        assert names(c.list_transactions(["Ongoing", "Nope"], [])) == ["a"]
        assert c.state_counts() == {"Ongoing": 1, "Empty": 1}
        assert names(c.list_transactions(["Nope"], [])) == []  # Kafka: an unknown state matches nothing

    run(tmp_path, body)


# -- partitions of the transaction log owned by this coordinator ------------------------------------------

TXN_TOPIC = "__transaction_state"


@pytest.mark.parametrize("commit", [True, False])
def test_a_prepared_transaction_is_completed_when_its_partition_is_loaded_again(tmp_path, commit):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        p = c.partition_for("x")
        assert await c.add_partitions("x", pid, 0, [(TOPIC, 0)], 3) == {(TOPIC, 0): NONE}
        first = node.append("x", pid, 0, 0).base_offset
        target = c.txns["x"].copy()
        target.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        assert await c._persist(target) == NONE  # the previous coordinator stopped right after PrepareX
        c.on_resignation(TXN_TOPIC, p)
        assert "x" not in c.txns and c.owner_error("x") == NOT_COORDINATOR
        assert (await c.end_txn("x", pid, 0, commit, 3)) == NOT_COORDINATOR
        await c.load_partition(p, 0)
        await wait_state(c, "x", TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
        assert node.partition().last_stable_offset == node.partition().log.high_watermark
        assert node.partition(0).aborted_transactions(0, 100) == ([] if commit else [(pid, first)])
        assert await c.end_txn("x", pid, 0, commit, 3) == NONE  # the client's retry, on the new coordinator

    run(tmp_path, body)


def test_a_transition_in_flight_when_its_partition_goes_is_not_applied(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        p = c.partition_for("x")
        in_flight = asyncio.ensure_future(c.add_partitions("x", pid, 0, [(TOPIC, 1)], 3))
        await asyncio.sleep(0)
        assert not in_flight.done()  # its write waits for the flush round
        c.on_resignation(TXN_TOPIC, p)
        assert await in_flight == {(TOPIC, 1): NOT_COORDINATOR}
        assert "x" not in c.txns and pid not in c.by_producer
        # The next load has what the log has: the write made it there, so the retry on it is answered as done.
        await c.load_partition(p, 0)
        assert c.txns["x"].state == TxnState.ONGOING and c.txns["x"].partitions == {(TOPIC, 1)}
        assert await c.add_partitions("x", pid, 0, [(TOPIC, 1)], 3) == {(TOPIC, 1): NONE}

    run(tmp_path, body, {"oncelog.fsync.enable": "true"})


def test_a_newer_leader_epoch_reloads_and_writes_under_it(tmp_path):
    async def body(node: Node, c: TransactionCoordinator) -> None:
        _, pid, _ = await init(c, "x")
        p = c.partition_for("x")
        before = c.txns["x"]
        assert c.load_partition(p, 0) is None and c.txns["x"] is before  # loaded at epoch 0 at startup
        await c.load_partition(p, 4)
        assert c.txns["x"] is not before and c.txns["x"].producer_id == pid
        # The single node leads the log's partitions at epoch 0: a coordinator loaded at 4 cannot write there.
        assert (await init(c, "x", pid, 0))[0] == NOT_COORDINATOR

    run(tmp_path, body)
