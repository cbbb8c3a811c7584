"""abort_transaction() after an AddPartitionsToTxn whose answer was lost (issue 6, the "Ongoing" CLI failure):
the coordinator may have started the transaction, so the abort must end it there too."""

from __future__ import annotations

import time

from tests.faults.proxy import FaultProxy
from tests.integration.client.admin_support import cli_json
from tests.integration.client.producer_support import producer
from tests.integration.helpers import create_topic


def test_abort_ends_a_transaction_whose_add_partitions_answer_was_lost(broker_factory, topic_name):
    """The coordinator applies AddPartitionsToTxn (the transaction is Ongoing there), the proxy drops its answer
    and cuts the connection, and the producer aborts before retrying it. Before the fix the producer thought it had
    added nothing, sent no EndTxn, and left the transaction Ongoing (the LSO held back) until its timeout."""
    proxy = FaultProxy(upstream_port=0).start()
    try:
        broker = broker_factory({"advertised.listeners": proxy.address})
        proxy.upstream_port = broker.port
        direct = broker.bootstrap
        create_topic(direct, topic_name, 1)
        txn_id = topic_name + "-txn"
        # a long backoff: the abort comes before AddPartitionsToTxn is retried
        p = producer(proxy.address, transactional_id=txn_id, retry_backoff_ms=5000, retry_backoff_max_ms=5000)
        p.init_transactions(15)
        p.begin_transaction()  # a first transaction: metadata and connections in place before the fault
        p.produce(topic_name, b"first", partition=0)
        p.commit_transaction(15)
        p.begin_transaction()
        proxy.set_mode("lose_responses")
        p.produce(topic_name, b"never visible", partition=0)
        time.sleep(1.0)  # AddPartitionsToTxn goes out at once; its retry waits 5 s
        proxy.set_mode("pass")  # (the broker advertises the proxy: the CLI below goes through it too)
        assert cli_json(direct, "transactions", "describe", txn_id)["state"] == "Ongoing", \
            "the coordinator should have applied the AddPartitionsToTxn whose answer was lost"
        started = time.monotonic()
        p.abort_transaction(15)
        assert time.monotonic() - started < 12
        assert cli_json(direct, "transactions", "describe", txn_id)["state"] == "CompleteAbort"
        # the producer goes on: the next transaction commits
        p.begin_transaction()
        p.produce(topic_name, b"visible", partition=0)
        p.commit_transaction(15)
        assert cli_json(direct, "transactions", "describe", txn_id)["state"] == "CompleteCommit"
        p.close()
    finally:
        proxy.stop()
