"""`oncelog produce TOPIC`: one record per stdin line, with oncelog's idempotent (or transactional) producer.

Lines are bytes: only the line end is removed, nothing is decoded. With --transactional every line
goes into one transaction that is committed at EOF and aborted on any error, so a failed run
leaves nothing visible to read_committed consumers.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import uuid
from typing import Any, BinaryIO

from .common import CommandError, client_config
from .output import Progress, print_json


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    produce = sub.add_parser("produce", parents=[common], help="produce stdin lines as records")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", "-K", metavar="SEP",
                         help="each line is KEY SEP VALUE (split at the first SEP); a line without it is an error")
    produce.add_argument("--partition", "-p", type=int, help="write every record to this partition")
    produce.add_argument("--transactional", action="store_true",
                         help="write all lines in one transaction, committed at the end")
    produce.add_argument("--transactional-id", help="with --transactional (default: a fresh random id)")
    produce.add_argument("--acks", default="all", choices=["all", "1", "0"], help="default all")
    produce.add_argument("--progress", action="store_true", default=None,
                         help="draw a progress bar even if stderr is not a terminal")
    produce.set_defaults(handler=_produce)


class _Tally:
    """Delivery reports, kept to what the summary needs (one branch per record)."""

    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0
        self.first_error: Any = None
        self.ranges: dict[int, list[int]] = {}  # partition -> [count, first offset, last offset]

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = err
            return
        self.delivered += 1
        offset = msg.offset()
        entry = self.ranges.get(msg.partition())
        if entry is None:
            self.ranges[msg.partition()] = [1, offset, offset]
        else:
            entry[0] += 1
            entry[1] = min(entry[1], offset)
            entry[2] = max(entry[2], offset)


def _input_size(stream: BinaryIO) -> int | None:
    """The byte size of stdin when it is a regular file (so the progress bar knows its total)."""
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _produce(args: argparse.Namespace) -> int:
    from ..client.producer import Producer

    if args.transactional_id and not args.transactional:
        raise CommandError("--transactional-id needs --transactional")
    extra: dict[str, Any] = {"acks": args.acks}
    if args.acks != "all":
        extra["enable.idempotence"] = False
    txn_id = None
    if args.transactional:
        txn_id = args.transactional_id or f"oncelog-cli-{uuid.uuid4()}"
        extra.update({"transactional.id": txn_id, "enable.idempotence": True})
    separator = args.key_separator.encode() if args.key_separator else None
    stdin = sys.stdin.buffer
    tally = _Tally()
    producer = Producer(client_config(args, extra))
    begun = False
    try:
        if txn_id:
            producer.init_transactions(args.timeout)
            producer.begin_transaction()
            begun = True
        lines = _send_lines(producer, args.topic, args.partition, separator, stdin, tally, args.progress)
        left = producer.flush(args.timeout)
        if left or tally.failed:
            raise CommandError(_failure(lines, left, tally))
        if txn_id:
            producer.commit_transaction(args.timeout)
    except BaseException:
        if begun:
            _abort_quietly(producer, args.timeout)
        raise
    finally:
        producer.close(5.0)
    partitions = {str(p): {"records": n, "first_offset": first, "last_offset": last}
                  for p, (n, first, last) in sorted(tally.ranges.items())}
    if args.json:
        print_json({"topic": args.topic, "records": tally.delivered, "partitions": partitions,
                    "transactional_id": txn_id})
    else:
        where = ", ".join(f"partition {p} offsets {r['first_offset']}-{r['last_offset']}" if r["first_offset"] >= 0
                          else f"partition {p} (offsets unknown with acks=0)" for p, r in partitions.items())
        committed = f" in transaction {txn_id} (committed)" if txn_id else ""
        print(f"Produced {tally.delivered} records to {args.topic}{committed}" + (f": {where}." if where else "."))
    return 0


def _send_lines(producer: Any, topic: str, partition: int | None, separator: bytes | None, stdin: BinaryIO,
                tally: _Tally, progress: bool | None) -> int:
    """Queue one record per line; returns the number of lines."""
    size = _input_size(stdin)
    count = 0
    report = tally.on_delivery
    with Progress(f"producing to {topic}", size, unit="bytes" if size else "records", enabled=progress) as bar:
        for raw in stdin:
            count += 1
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if line.endswith(b"\r"):
                line = line[:-1]
            key = None
            if separator is not None:
                key, sep, line = line.partition(separator)
                if not sep:
                    raise CommandError(f"line {count} has no key separator {separator.decode()!r}")
            while True:
                try:
                    producer.produce(topic, line, key, partition, on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.05)
            bar.advance(len(raw) if size else 1)
            if count % 1000 == 0:
                producer.poll(0)
    return count


def _failure(lines: int, left: int, tally: _Tally) -> str:
    if tally.first_error is not None:
        return f"{tally.failed} of {lines} records failed: {tally.first_error}"
    return f"{left} of {lines} records were not delivered in time"


def _abort_quietly(producer: Any, timeout: float) -> None:
    """Abort after a failure; the original error is what the user needs to see."""
    try:
        producer.abort_transaction(timeout)
    except Exception as exc:  # noqa: BLE001 - reported, but the first error wins
        print(f"oncelog: warning: abort failed too: {exc}", file=sys.stderr)
