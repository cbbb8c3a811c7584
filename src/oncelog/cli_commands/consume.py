"""`oncelog consume TOPIC`: print records with oncelog's consumer, in a group or from chosen partitions.

Without --group the consumer assigns itself the topic's partitions (or --partition) and starts at
the end, at the beginning (--from-beginning) or at --offset; with --group it joins the group and
starts at the group's committed offsets, and commits exactly what it printed when it stops: at the end,
or on Ctrl-C or SIGTERM, after which it leaves the group (so its partitions move to other members at once).
Records are printed as they are (raw bytes, one per line) or as JSON Lines with --json.
Output is written a fetched batch at a time, not a record at a time.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from .common import CommandError, admin_client, client_config, non_negative
from .interrupts import deferred
from .output import Progress

BATCH = 500  # messages taken from the consumer per call


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    consume = sub.add_parser("consume", parents=[common], help="print records of a topic")
    consume.add_argument("topic")
    consume.add_argument("--group", "-g", help="consume as a member of this group (commits what it printed)")
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at the earliest offset (in a group: where the group has no offset yet)")
    consume.add_argument("--partition", "-p", type=int, help="only this partition (no group)")
    consume.add_argument("--offset", "-o", help="with --partition: start offset, or earliest / latest")
    consume.add_argument("--isolation", default="read_committed", choices=["read_committed", "read_uncommitted"],
                         help="read_committed (default) skips aborted records and stops at open transactions")
    consume.add_argument("--max", "-n", type=non_negative, metavar="N", help="stop after N records")
    consume.add_argument("--until-end", "-e", action="store_true",
                         help="stop when every partition is read up to where it ended when assigned")
    consume.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                         help="stop when no record arrives for this long")
    consume.add_argument("--print-key", action="store_true", help="print KEY SEP VALUE (text output)")
    consume.add_argument("--key-separator", default="\t", metavar="SEP", help="with --print-key (default TAB)")
    consume.add_argument("--progress", action="store_true", default=None,
                         help="draw a progress bar even if stderr is not a terminal")
    consume.set_defaults(handler=_consume)


def _start_offset(text: str | None, from_beginning: bool) -> int:
    from ..client.types import OFFSET_BEGINNING, OFFSET_END

    if text is None:
        return OFFSET_BEGINNING if from_beginning else OFFSET_END
    if text in ("earliest", "beginning"):
        return OFFSET_BEGINNING
    if text in ("latest", "end"):
        return OFFSET_END
    try:
        offset = int(text)
    except ValueError:
        raise CommandError(f"--offset must be a number, earliest or latest, not {text!r}") from None
    if offset < 0:
        raise CommandError(f"--offset must be >= 0, not {offset}")
    return offset


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def _quoted(data: bytes | None) -> str:
    """A key, value or header as a JSON string (base64: prefix when not UTF-8), or null."""
    text = _text(data)
    return "null" if text is None else _quote(text)


def _json_lines(records: list[Any]) -> str:
    """JSON Lines for a batch of records, built with the C string escaper rather than a dict per record."""
    lines = []
    topic_json: dict[str | None, str] = {}
    for m in records:
        topic = m.topic()
        tq = topic_json.get(topic)
        if tq is None:
            tq = topic_json[topic] = "null" if topic is None else _quote(topic)
        headers = m.headers()
        hq = "[" + ",".join(f"[{_quote(k)},{_quoted(v)}]" for k, v in headers) + "]" if headers else "[]"
        lines.append(f'{{"topic":{tq},"partition":{m.partition()},"offset":{m.offset()},'
                     f'"timestamp":{m.timestamp()[1]},"key":{_quoted(m.key())},"value":{_quoted(m.value())},'
                     f'"headers":{hq}}}')
    lines.append("")
    return "\n".join(lines)


class _Ends:
    """--until-end: the end offset of each partition, taken when it is first assigned."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ends: dict[tuple[str, int], int] = {}

    def reached(self, consumer: Any) -> bool:
        assigned = consumer.assignment()
        if not assigned:
            return False
        new = [(tp.topic, tp.partition) for tp in assigned if (tp.topic, tp.partition) not in self.ends]
        if new:
            with admin_client(self.args) as admin:
                found = admin.list_offsets({tp: "latest" for tp in new}, isolation=self.args.isolation)
            self.ends.update({(tp.topic, tp.partition): o.offset for tp, o in found.items()})
        positions = consumer.position(assigned)
        return all(tp.offset >= self.ends[(tp.topic, tp.partition)] or
                   (tp.offset < 0 and self.ends[(tp.topic, tp.partition)] == 0) for tp in positions)


def _consume(args: argparse.Namespace) -> int:
    from ..client.consumer.consumer import Consumer
    from ..client.errors import KafkaError
    from ..client.types import TopicPartition

    if args.offset is not None and args.partition is None:
        raise CommandError("--offset needs --partition")
    if args.group and (args.partition is not None):
        raise CommandError("--partition cannot be used with --group")
    conf: dict[str, Any] = {"isolation.level": args.isolation, "enable.auto.commit": False,
                            "auto.offset.reset": "earliest" if args.from_beginning else "latest"}
    if args.group:
        conf["group.id"] = args.group
    consumer = Consumer(client_config(args, conf))
    printed = 0
    out = sys.stdout.buffer
    sep = args.key_separator.encode()
    ends = _Ends(args) if args.until_end else None
    mid_batch = False
    try:
        if args.group:
            consumer.subscribe([args.topic])
        else:
            with admin_client(args) as admin:
                partitions = [tp.partition for tp in admin.topic_partitions(args.topic)]
            if args.partition is not None:
                if args.partition not in partitions:
                    raise CommandError(f"topic {args.topic} has no partition {args.partition}")
                partitions = [args.partition]
            start = _start_offset(args.offset, args.from_beginning)
            consumer.assign([TopicPartition(args.topic, p, start) for p in partitions])
        last_record = time.monotonic()
        with Progress(f"consuming {args.topic}", args.max, enabled=args.progress) as bar:
            while args.max is None or printed < args.max:
                want = BATCH if args.max is None else min(BATCH, args.max - printed)
                # Ctrl-C or SIGTERM waits until the records taken are printed and counted, so the consumer's
                # positions (what the commit below sends) are exactly what was printed.
                with deferred():
                    mid_batch = True
                    messages = consumer.consume(want, 0.2)
                    records = []
                    for msg in messages:
                        error = msg.error()
                        if error is not None:
                            raise error if isinstance(error, KafkaError) else KafkaError(str(error))
                        records.append(msg)
                    if records:
                        last_record = time.monotonic()
                        _write(out, records, args.json, args.print_key, sep)
                        printed += len(records)
                        bar.advance(len(records))
                    mid_batch = False
                if not records and args.idle_timeout is not None and \
                        time.monotonic() - last_record >= args.idle_timeout:
                    break
                if ends is not None and not records and ends.reached(consumer):
                    break
        if args.group and printed:
            consumer.commit(asynchronous=False)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (interrupts.py); a second one mid-batch skips the commit
        if args.group and printed and not mid_batch:
            consumer.commit(asynchronous=False)
    finally:
        out.flush()
        consumer.close()
    if sys.stderr.isatty():
        print(f"Processed {printed} records.", file=sys.stderr)
    return 0


def _write(out: Any, records: list[Any], as_json: bool, print_key: bool, sep: bytes) -> None:
    if as_json:
        out.write(_json_lines(records).encode())
    elif print_key:
        out.write(b"".join((m.key() or b"") + sep + (m.value() or b"") + b"\n" for m in records))
    else:
        out.write(b"".join((m.value() or b"") + b"\n" for m in records))
    out.flush()
