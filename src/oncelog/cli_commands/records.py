"""`oncelog records delete TOPIC:PARTITION --before OFFSET` and `oncelog records offsets TOPIC`."""

from __future__ import annotations

import argparse
from typing import Any

from .common import admin_client, topic_partition
from .output import print_json, print_table


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    records = sub.add_parser("records", help="delete records, look up offsets")
    verbs = records.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    delete = verbs.add_parser("delete", parents=[common],
                              help="delete the records before an offset (moves the log start offset)")
    delete.add_argument("partitions", nargs="+", type=topic_partition, metavar="TOPIC:PARTITION")
    delete.add_argument("--before", required=True, type=int, metavar="OFFSET",
                        help="first offset to keep; -1: the high watermark (delete everything)")
    delete.set_defaults(handler=_delete)

    offsets = verbs.add_parser("offsets", parents=[common], help="offsets of a topic's partitions")
    offsets.add_argument("topic")
    offsets.add_argument("--partition", "-p", type=int, action="append", help="only this partition, repeatable")
    offsets.add_argument("--time", default="latest", metavar="SPEC",
                         help="earliest, latest (default), max_timestamp, or a timestamp in ms")
    offsets.add_argument("--isolation", default="read_uncommitted", choices=["read_uncommitted", "read_committed"],
                         help="read_committed: latest is the last stable offset")
    offsets.set_defaults(handler=_offsets)


def _delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        result = admin.delete_records({tp: args.before for tp in args.partitions})
    rows = [{"topic": tp.topic, "partition": tp.partition, "low_watermark": low} for tp, low in result.items()]
    if args.json:
        print_json(rows)
    else:
        print_table(["TOPIC", "PARTITION", "LOW WATERMARK"], [tuple(r.values()) for r in rows])
    return 0


def _offsets(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        partitions = args.partition or [tp.partition for tp in admin.topic_partitions(args.topic)]
        result = admin.list_offsets({(args.topic, p): args.time for p in partitions}, isolation=args.isolation)
    rows = [{"topic": tp.topic, "partition": tp.partition, "offset": o.offset, "timestamp": o.timestamp}
            for tp, o in sorted(result.items())]
    if args.json:
        print_json(rows)
    else:
        print_table(["TOPIC", "PARTITION", "OFFSET", "TIMESTAMP"], [tuple(r.values()) for r in rows])
    return 0
