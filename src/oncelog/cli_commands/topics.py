"""`oncelog topics create|list|describe|delete|alter`."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import CommandError, admin_client, key_values
from .output import print_json, print_table


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    topics = sub.add_parser("topics", help="create, list, describe, delete and alter topics")
    verbs = topics.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    create = verbs.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", "-p", type=int, default=-1, help="default: the broker's num.partitions")
    create.add_argument("--replication-factor", "-r", type=int, default=-1)
    create.add_argument("--config", "-c", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic config override, repeatable")
    create.add_argument("--validate-only", action="store_true", help="check the request, create nothing")
    create.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    create.set_defaults(handler=_create)

    listing = verbs.add_parser("list", parents=[common], help="list topics")
    listing.add_argument("--internal", action="store_true", help="include internal topics")
    listing.set_defaults(handler=_list)

    describe = verbs.add_parser("describe", parents=[common], help="partitions and configs of topics")
    describe.add_argument("topics", nargs="+", metavar="TOPIC")
    describe.add_argument("--all-configs", action="store_true", help="show every config, not only overrides")
    describe.set_defaults(handler=_describe)

    delete = verbs.add_parser("delete", parents=[common], help="delete topics")
    delete.add_argument("topics", nargs="+", metavar="TOPIC")
    delete.add_argument("--if-exists", action="store_true", help="succeed if a topic does not exist")
    delete.set_defaults(handler=_delete)

    alter = verbs.add_parser("alter", parents=[common], help="add partitions, set or delete config overrides")
    alter.add_argument("topic")
    alter.add_argument("--partitions", "-p", type=int, help="the new total number of partitions")
    alter.add_argument("--config", "-c", action="append", default=[], metavar="KEY=VALUE",
                       help="set a config override, repeatable")
    alter.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                       help="remove a config override (back to the default), repeatable")
    alter.add_argument("--validate-only", action="store_true")
    alter.set_defaults(handler=_alter)


def _create(args: argparse.Namespace) -> int:
    from ..client.errors import KafkaError
    from ..errors import ErrorCode

    configs = key_values(args.config, "--config")
    with admin_client(args) as admin:
        try:
            created = admin.create_topic(args.topic, args.partitions, args.replication_factor, configs,
                                         validate_only=args.validate_only)
        except KafkaError as exc:
            if not (args.if_not_exists and exc.code == ErrorCode.TOPIC_ALREADY_EXISTS):
                raise
            if args.json:
                print_json({"name": args.topic, "created": False})
            else:
                print(f"Topic {args.topic} already exists.")
            return 0
    if args.json:
        print_json({**created.as_dict(), "created": not args.validate_only})
    else:
        verb = "Would create" if args.validate_only else "Created"
        print(f"{verb} topic {created.name} with {created.num_partitions} partitions"
              + (f" (id {created.topic_id})." if created.topic_id else "."))
    return 0


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        topics = admin.list_topics(include_internal=args.internal)
    if args.json:
        print_json([t.as_dict() for t in topics])
    else:
        print_table(["TOPIC", "PARTITIONS", "TOPIC ID", "INTERNAL"],
                    [(t.name, t.partitions, t.topic_id, t.internal) for t in topics])
    return 0


def _describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        described = admin.describe_topics(args.topics, include_configs=True)
    if args.json:
        print_json([d.as_dict() for d in described.values()])
        return 0
    for i, d in enumerate(described.values()):
        if i:
            print()
        configs = d.configs or {}
        shown = [c for c in configs.values() if args.all_configs or not c.is_default]
        print(f"Topic: {d.name}  TopicId: {d.topic_id}  Partitions: {len(d.partitions)}"
              f"  ReplicationFactor: {len(d.partitions[0].replicas) if d.partitions else 0}")
        print_table(["PARTITION", "LEADER", "LEADER EPOCH", "REPLICAS", "ISR"],
                    [(p.partition, p.leader, p.leader_epoch, p.replicas, p.isr) for p in d.partitions])
        if shown:
            print_table(["CONFIG", "VALUE", "SOURCE"], [(c.name, c.value, c.source) for c in shown])
    return 0


def _delete(args: argparse.Namespace) -> int:
    from ..client.errors import KafkaError
    from ..errors import ErrorCode

    deleted = []
    with admin_client(args) as admin:
        for topic in dict.fromkeys(args.topics):
            try:
                admin.delete_topic(topic)
                deleted.append(topic)
            except KafkaError as exc:
                if not (args.if_exists and exc.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                    raise
    if args.json:
        print_json({"deleted": deleted})
    else:
        for topic in deleted:
            print(f"Deleted topic {topic}.")
    return 0


_APPLIED_POLL_S = 0.05
# How long `topics alter` looks for its change in the broker's answers before printing them as they are: a broker
# applies committed metadata within milliseconds; a value the broker normalised never matches, so do not wait long.
_APPLIED_WAIT_MAX_S = 10.0


def _applied(described: Any, partitions: int | None, configs: dict[str, str], deleted: list[str]) -> bool:
    """Whether the description shows the change: the partition count, each override set, each one removed."""
    entries = described.configs or {}
    if partitions is not None and len(described.partitions) < partitions:
        return False
    for key, value in configs.items():
        entry = entries.get(key)
        if entry is None or entry.source != "DYNAMIC_TOPIC_CONFIG" or (entry.value != value and not entry.sensitive):
            return False
    return not any(key in entries and entries[key].source == "DYNAMIC_TOPIC_CONFIG" for key in deleted)


def _until_applied(admin: Any, args: argparse.Namespace, configs: dict[str, str], described: Any) -> Any:
    """The topic as it is once the change shows. Apache Kafka acknowledges CreatePartitions and
    IncrementalAlterConfigs when its controller has committed them and the answering broker applies them to its
    metadata a moment later, so a description read at once can still show the old state."""
    deadline = time.monotonic() + min(args.timeout, _APPLIED_WAIT_MAX_S)
    while not _applied(described, args.partitions, configs, args.delete_config) and time.monotonic() < deadline:
        time.sleep(_APPLIED_POLL_S)
        described = admin.describe_topic(args.topic, include_configs=True)
    return described


def _alter(args: argparse.Namespace) -> int:
    configs = key_values(args.config, "--config")
    if args.partitions is None and not configs and not args.delete_config:
        raise CommandError("nothing to alter: give --partitions, --config or --delete-config")
    with admin_client(args) as admin:
        if args.partitions is not None:
            admin.create_partitions(args.topic, args.partitions, validate_only=args.validate_only)
        if configs or args.delete_config:
            admin.alter_topic_configs(args.topic, set=configs, delete=args.delete_config,
                                      validate_only=args.validate_only)
        described = admin.describe_topic(args.topic, include_configs=True)
        if not args.validate_only:
            described = _until_applied(admin, args, configs, described)
    overrides = {c.name: c.value for c in (described.configs or {}).values() if c.source == "DYNAMIC_TOPIC_CONFIG"}
    if args.json:
        print_json({"name": args.topic, "partitions": len(described.partitions), "overrides": overrides,
                    "validate_only": args.validate_only})
    else:
        prefix = "Validated" if args.validate_only else "Altered"
        print(f"{prefix} topic {args.topic}: {len(described.partitions)} partitions, overrides "
              + (", ".join(f"{k}={v}" for k, v in overrides.items()) or "none") + ".")
    return 0
