"""`oncelog groups list|describe|delete|reset-offsets` (kafka-consumer-groups.sh's commands)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import CommandError, admin_client, topic_partitions
from .output import Progress, print_json, print_table

COMMIT_CHUNK = 500  # partitions per OffsetCommit while resetting


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    groups = sub.add_parser("groups", help="list, describe, delete consumer groups, reset their offsets")
    verbs = groups.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    listing = verbs.add_parser("list", parents=[common], help="groups on every broker")
    listing.add_argument("--state", action="append", default=[], help="only groups in this state, repeatable")
    listing.set_defaults(handler=_list)

    describe = verbs.add_parser("describe", parents=[common], help="members, committed offsets and lag of a group")
    describe.add_argument("group")
    describe.set_defaults(handler=_describe)

    delete = verbs.add_parser("delete", parents=[common], help="delete empty groups and their offsets")
    delete.add_argument("groups", nargs="+", metavar="GROUP")
    delete.set_defaults(handler=_delete)

    reset = verbs.add_parser("reset-offsets", parents=[common], help="move an inactive group's committed offsets")
    reset.add_argument("group")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", action="append", type=topic_partitions, metavar="TOPIC[:P,P...]",
                       help="reset these partitions (default every partition of the topic), repeatable")
    scope.add_argument("--all-topics", action="store_true", help="every partition the group has offsets for")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-offset", type=int, metavar="OFFSET")
    target.add_argument("--shift-by", type=int, metavar="N", help="move the committed offsets by N (may be < 0)")
    # Kafka's kafka-consumer-groups.sh: a reset only changes offsets with --execute; without it, the plan is shown.
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    mode.add_argument("--dry-run", action="store_true", help="print the plan, change nothing (the default)")
    reset.add_argument("--progress", action="store_true", default=None, help="draw a progress bar even if stderr "
                       "is not a terminal")
    reset.set_defaults(handler=_reset)


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        listed = admin.list_groups(args.state)
    if args.json:
        print_json([g.as_dict() for g in listed])
    else:
        print_table(["GROUP", "STATE", "PROTOCOL TYPE"], [(g.group_id, g.state, g.protocol_type) for g in listed])
    return 0


def _describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        group = admin.describe_group(args.group)
        committed = admin.list_group_offsets(args.group)
        if group.state == "Dead" and not committed:
            raise CommandError(f"group {args.group!r} does not exist")
        ends = admin.list_offsets({tp: "latest" for tp in committed}) if committed else {}
    owner = {tp: m for m in group.members for tp in m.assignment}
    offsets = []
    for tp, c in committed.items():
        end = ends[tp].offset
        member = owner.get((tp.topic, tp.partition))
        offsets.append({"topic": tp.topic, "partition": tp.partition, "current_offset": c.offset,
                        "log_end_offset": end, "lag": max(end - c.offset, 0) if c.offset >= 0 else None,
                        "member_id": member.member_id if member else None,
                        "host": member.host if member else None, "client_id": member.client_id if member else None})
    if args.json:
        print_json({**group.as_dict(), "offsets": offsets})
        return 0
    print(f"Group: {group.group_id}  State: {group.state}  Protocol: {group.protocol_type or '-'}"
          f"/{group.protocol or '-'}  Coordinator: {group.coordinator}  Members: {len(group.members)}")
    if offsets:
        print_table(["TOPIC", "PARTITION", "CURRENT OFFSET", "LOG END OFFSET", "LAG", "MEMBER ID", "HOST",
                     "CLIENT ID"], [tuple(o.values()) for o in offsets])
    if group.members:
        print_table(["MEMBER ID", "INSTANCE ID", "CLIENT ID", "HOST", "PARTITIONS"],
                    [(m.member_id, m.group_instance_id, m.client_id, m.host,
                      [f"{t}-{p}" for t, p in m.assignment]) for m in group.members])
    return 0


def _delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        for group in dict.fromkeys(args.groups):
            admin.delete_group(group)
    if args.json:
        print_json({"deleted": list(dict.fromkeys(args.groups))})
    else:
        for group in dict.fromkeys(args.groups):
            print(f"Deleted group {group}.")
    return 0


def _reset(args: argparse.Namespace) -> int:
    if args.to_earliest:
        to, value = "earliest", None
    elif args.to_latest:
        to, value = "latest", None
    elif args.to_offset is not None:
        to, value = "offset", args.to_offset
    else:
        to, value = "shift", args.shift_by
    with admin_client(args) as admin:
        if args.all_topics:
            partitions = list(admin.list_group_offsets(args.group))
            if not partitions:
                raise CommandError(f"group {args.group!r} has no committed offsets; name the partitions with --topic")
        else:
            partitions = []
            for topic, chosen in args.topic:
                if chosen is None:
                    partitions += admin.topic_partitions(topic)
                else:
                    partitions += [(topic, p) for p in chosen]
        plan = admin.plan_group_offset_reset(args.group, partitions, to=to, value=value)
        dry_run = not args.execute
        if not dry_run:
            with Progress(f"resetting {args.group}", len(plan), unit="partitions", enabled=args.progress) as bar:
                for start in range(0, len(plan), COMMIT_CHUNK):
                    chunk = plan[start:start + COMMIT_CHUNK]
                    admin.alter_group_offsets(args.group, {(r.topic, r.partition): r.target for r in chunk})
                    bar.advance(len(chunk))
    rows = [r.as_dict() for r in plan]
    if args.json:
        print_json({"group": args.group, "dry_run": dry_run, "partitions": rows})
    else:
        print_table(["TOPIC", "PARTITION", "CURRENT OFFSET", "NEW OFFSET"],
                    [(r.topic, r.partition, r.current, r.target) for r in plan])
    if dry_run and not args.dry_run:
        print("oncelog: nothing changed: this was a plan; add --execute to reset the offsets", file=sys.stderr)
    elif dry_run and not args.json:
        print("(dry run: nothing changed)")
    return 0
