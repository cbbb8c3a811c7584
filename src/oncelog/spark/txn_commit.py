"""The driver's half of the sink's two-phase write: EndTxn for the transactions the tasks prepared.

A task cannot commit its own transaction safely in PySpark (see sink.py): when the plan upstream of the
sink fails half-way through a partition, the Python writer's input simply ends, exactly like a complete
partition, and the writer cannot tell the difference. So a task only *prepares*: its rows and its batch
marker are in an open transaction, fully acknowledged, and it reports (transactional id, producer id, epoch).
Spark calls the driver's `commit(messages, N)` only when every task of the batch succeeded; it then sends
EndTxn(COMMIT) for each. EndTxn names the exact (producer id, epoch): a transaction fenced since (by a retry
of its task) can no longer be committed by mistake, and a repeated EndTxn of a finished commit answers NONE,
so a `commit(N)` that Spark runs twice is harmless.

EndTxn goes out at version 4 at most, never at the highest version the coordinator speaks: EndTxn v5 is
transaction version 2 (KIP-890), and Kafka 4.x applies TV2's rules to it whatever the cluster's finalized
`transaction.version` (the epoch is bumped when the transaction ends, a repeat is recognised by the epoch
being one lower). The tasks open their transactions with TV1 requests (Produce v11, AddPartitionsToTxn v3),
and a commit repeated at another version than the first answers PRODUCER_FENCED (v5, then v4) or
INVALID_TXN_STATE (v4, then v5) instead of NONE. docs/transactions-v2.md has the rules and what adopting
TV2 would change; tests/kafka/test_transactions_v2.py pins them against Apache Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from oncelog.client.cluster import Cluster
from oncelog.client.errors import KafkaError, RetriableError, error_for
from oncelog.client.runtime import get_runtime
from oncelog.errors import ErrorCode
from oncelog.protocol.apis import ApiKey
from oncelog.spark.markers import sink_cluster
from oncelog.spark.write_options import WriteOptions

log = logging.getLogger("oncelog.spark.sink")

COORDINATOR_TRANSACTION = 1
# The transaction-version-1 EndTxn (see above): the same rules for the first EndTxn and every repeat of it.
END_TXN_MAX_VERSION = 4
# The coordinator is still writing the markers of this transactional id's previous step: ask again shortly.
_BUSY = frozenset({ErrorCode.CONCURRENT_TRANSACTIONS})
_BACKOFF = 0.05


class Prepared(Protocol):
    transactional_id: str | None
    producer_id: int
    epoch: int


async def _end_one(cluster: Cluster, request_timeout: float, txn: Prepared, commit: bool, deadline: float) -> None:
    data = {"transactional_id": txn.transactional_id, "producer_id": txn.producer_id,
            "producer_epoch": txn.epoch, "committed": commit}
    delay = _BACKOFF
    while True:
        try:
            timeout = max(0.1, min(request_timeout, deadline - time.monotonic()))
            conn = await cluster.coordinator(txn.transactional_id, COORDINATOR_TRANSACTION, timeout=timeout)
            version = conn.api_version(ApiKey.END_TXN, END_TXN_MAX_VERSION)
            resp = await cluster.coordinator_call(txn.transactional_id, COORDINATOR_TRANSACTION, ApiKey.END_TXN,
                                                  data, version=version, timeout=timeout)
            code = resp.error_code
            if code == ErrorCode.NONE:
                return
            error = error_for(code, getattr(resp, "error_message", None), coordinator=True) \
                or KafkaError(None, code)
            if code not in _BUSY and not error.retriable:
                raise KafkaError(f"EndTxn({'commit' if commit else 'abort'}) of {txn.transactional_id} "
                                 f"(producer {txn.producer_id}, epoch {txn.epoch}): {error}", code)
        except RetriableError as exc:
            error = exc
        if time.monotonic() + delay > deadline:
            raise KafkaError(f"EndTxn of {txn.transactional_id} did not succeed in time; last error: {error}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def _end_all(cluster: Cluster, request_timeout: float, txns: Sequence[Prepared], commit: bool,
                   timeout: float) -> list[BaseException | None]:
    deadline = time.monotonic() + timeout
    return await asyncio.gather(*(_end_one(cluster, request_timeout, t, commit, deadline) for t in txns),
                                return_exceptions=True)


def end_transactions(options: WriteOptions, txns: Sequence[Prepared], *, commit: bool,
                     timeout: float = 120.0) -> list[BaseException | None]:
    """EndTxn for every prepared transaction, all at once; one outcome per transaction (None: done)."""
    if not txns:
        return []
    cluster, config = sink_cluster(options)
    request_timeout = config["request.timeout.ms"] / 1000
    return get_runtime().run(_end_all(cluster, request_timeout, txns, commit, timeout), timeout=timeout + 5)
