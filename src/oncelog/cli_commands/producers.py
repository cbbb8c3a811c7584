"""`oncelog producers describe TOPIC [-p N]`: the partition leaders' producer state (KIP-664)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import admin_client
from .output import print_json, print_table


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    producers = sub.add_parser("producers", help="active producers of partitions")
    verbs = producers.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    describe = verbs.add_parser("describe", parents=[common],
                                help="producer ids, epochs, sequences and open transactions per partition")
    describe.add_argument("topic")
    describe.add_argument("--partition", "-p", type=int, action="append", help="only this partition, repeatable")
    describe.set_defaults(handler=_describe)


def _describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        partitions = args.partition or [tp.partition for tp in admin.topic_partitions(args.topic)]
        found = admin.describe_producers([(args.topic, p) for p in partitions])
    rows = [{"topic": tp.topic, "partition": tp.partition, **state.as_dict()}
            for tp, states in sorted(found.items()) for state in states]
    if args.json:
        print_json(rows)
    else:
        print_table(
            ["PARTITION", "PRODUCER ID", "EPOCH", "LAST SEQUENCE", "LAST TIMESTAMP", "COORDINATOR EPOCH",
             "TXN START OFFSET"],
            [(r["partition"], r["producer_id"], r["producer_epoch"], r["last_sequence"], r["last_timestamp"],
              r["coordinator_epoch"], r["current_txn_start_offset"]) for r in rows],
        )
    return 0
