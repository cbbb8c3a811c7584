"""`oncelog transactions list|describe|find-hanging|abort` (KIP-664, kafka-transactions.sh's commands)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import CommandError, admin_client
from .output import print_json, print_table


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    txns = sub.add_parser("transactions", help="list, describe, find and abort transactions")
    verbs = txns.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    listing = verbs.add_parser("list", parents=[common], help="transactional ids known to the coordinators")
    listing.add_argument("--state", action="append", default=[],
                         help="only this state (Ongoing, PrepareCommit, CompleteAbort, ...), repeatable")
    listing.add_argument("--producer-id", type=int, action="append", default=[], help="repeatable")
    listing.add_argument("--min-duration-ms", type=int, help="only transactions running longer than this")
    listing.set_defaults(handler=_list)

    describe = verbs.add_parser("describe", parents=[common], help="the coordinator's state of one transaction")
    describe.add_argument("transactional_id", metavar="TRANSACTIONAL_ID")
    describe.set_defaults(handler=_describe)

    hanging = verbs.add_parser(
        "find-hanging", parents=[common],
        help="open transactions that no coordinator will finish (kafka-transactions.sh's rule)")
    hanging.add_argument("--topic", help="search this topic only (default: every topic)")
    hanging.add_argument("--partition", type=int, help="search this partition of --topic only")
    hanging.add_argument("--max-transaction-timeout", type=float, default=15.0, metavar="MINUTES",
                         help="only transactions whose producer has been silent longer than this (default 15)")
    hanging.set_defaults(handler=_find_hanging)

    abort = verbs.add_parser("abort", parents=[common],
                             help="abort a hanging transaction on one partition (writes an abort marker)")
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True)
    abort.add_argument("--start-offset", type=int, help="first offset of the transaction to abort")
    abort.add_argument("--producer-id", type=int, help="instead of --start-offset, with the next two")
    abort.add_argument("--producer-epoch", type=int)
    abort.add_argument("--coordinator-epoch", type=int)
    abort.set_defaults(handler=_abort)


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        listed = admin.list_transactions(args.state, args.producer_id, args.min_duration_ms)
    if args.json:
        print_json([t.as_dict() for t in listed])
    else:
        print_table(["TRANSACTIONAL ID", "PRODUCER ID", "STATE"],
                    [(t.transactional_id, t.producer_id, t.state) for t in listed])
    return 0


def _describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        d = admin.describe_transaction(args.transactional_id)
    if args.json:
        print_json(d.as_dict())
        return 0
    duration = None if d.start_time_ms is None else int(time.time() * 1000) - d.start_time_ms
    print_table(
        ["COORDINATOR", "TRANSACTIONAL ID", "PRODUCER ID", "EPOCH", "STATE", "TIMEOUT MS", "START TIME MS",
         "DURATION MS", "PARTITIONS"],
        [(d.coordinator_id, d.transactional_id, d.producer_id, d.producer_epoch, d.state, d.timeout_ms,
          d.start_time_ms, duration, [f"{t}-{p}" for t, p in d.partitions])],
    )
    return 0


def _find_hanging(args: argparse.Namespace) -> int:
    if args.partition is not None and args.topic is None:
        raise CommandError("--partition needs --topic")
    with admin_client(args) as admin:
        found = admin.find_hanging_transactions(
            args.topic, args.partition, max_transaction_timeout_ms=int(args.max_transaction_timeout * 60_000))
    if args.json:
        print_json([h.as_dict() for h in found])
    else:
        print_table(
            ["TOPIC", "PARTITION", "PRODUCER ID", "EPOCH", "COORDINATOR EPOCH", "START OFFSET", "LAST TIMESTAMP",
             "DURATION MIN", "REASON"],
            [(h.topic, h.partition, h.producer_id, h.producer_epoch, h.coordinator_epoch, h.start_offset,
              h.last_timestamp, h.duration_ms // 60_000, h.reason) for h in found],
        )
    return 0


def _abort(args: argparse.Namespace) -> int:
    by_producer = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is None and args.producer_id is None:
        raise CommandError("identify the transaction with --start-offset, or with --producer-id, "
                           "--producer-epoch and --coordinator-epoch")
    if args.start_offset is not None and any(v is not None for v in by_producer):
        raise CommandError("give either --start-offset or --producer-id/--producer-epoch/--coordinator-epoch")
    if args.start_offset is None and any(v is None for v in by_producer):
        raise CommandError("--producer-id needs --producer-epoch and --coordinator-epoch")
    with admin_client(args) as admin:
        if args.start_offset is not None:
            state = admin.abort_transaction_at(args.topic, args.partition, args.start_offset)
            pid, epoch, coordinator_epoch = state.producer_id, state.producer_epoch, state.coordinator_epoch
        else:
            pid, epoch, coordinator_epoch = by_producer
            admin.abort_transaction(args.topic, args.partition, pid, epoch, coordinator_epoch)
    result = {"topic": args.topic, "partition": args.partition, "producer_id": pid, "producer_epoch": epoch,
              "coordinator_epoch": coordinator_epoch, "aborted": True}
    if args.json:
        print_json(result)
    else:
        print(f"Aborted the transaction of producer {pid} (epoch {epoch}) on {args.topic}-{args.partition}.")
    return 0
