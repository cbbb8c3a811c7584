"""The batch sizes of cluster/store/writes.py without ZooKeeper: a topic too big for one request is created and
deleted in steps, and each step's multi-op, measured as kazoo sends it, must fit in the limit (ZooKeeper drops the
connection of a bigger request instead of answering), for short and the longest topic names, partition numbers
of many digits and wide ISRs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import TransactionRequest
from kazoo.protocol.serialization import Transaction

from oncelog.cluster.metadata_image import PartitionState
from oncelog.cluster.store import znodes
from oncelog.cluster.store.writes import creation_batch, deletion_batch

CHROOT = "/oncelog/a-rather-long-chroot-of-a-shared-ensemble"
NAMES = ["t", "x" * 249]                    # Kafka's longest topic name
LIMITS = [20_000, znodes.MAX_MULTI_BYTES]   # what the cluster tests lower it to, and the real one


class Client:
    """What kazoo's TransactionRequest reads of its client."""

    chroot = ""
    default_acl = None
    logger = logging.getLogger("kazoo.client")


def size(build: Callable[[Any], None]) -> int:
    txn = TransactionRequest(Client())
    build(txn)
    return len(Transaction(txn.operations).serialize())


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("name", NAMES)
def test_a_step_of_a_creation_fits_in_one_request(name: str, limit: int) -> None:
    base = CHROOT + znodes.topic_path(name)
    batch = creation_batch(base, limit)
    assert batch > 1
    wide = PartitionState(99_999, 2**31 - 1, tuple(range(99_990, 99_997)), 2**31 - 1, 0, log_start_floor=2**62)
    first = 1_000_000 - batch                # partition numbers of the most digits

    def build(txn: Any) -> None:
        txn.check(CHROOT + znodes.CONTROLLER_EPOCH, 12)
        for p in range(first, first + batch):
            txn.create(f"{base}/partitions/{p}", b"")
            txn.create(f"{base}/partitions/{p}/state", znodes.state_json(wide))

    assert size(build) <= limit


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("name", NAMES)
def test_a_step_of_a_deletion_fits_in_one_request(name: str, limit: int) -> None:
    base = CHROOT + znodes.topic_path(name) + "/partitions"
    batch = deletion_batch(base, limit)
    assert batch > 1
    first = 1_000_000 - batch

    def build(txn: Any) -> None:
        txn.check(CHROOT + znodes.CONTROLLER_EPOCH, 12)
        for p in range(first, first + batch):
            txn.delete(f"{base}/{p}/state")
            txn.delete(f"{base}/{p}")

    assert size(build) <= limit
