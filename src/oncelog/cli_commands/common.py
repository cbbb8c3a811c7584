"""What every client command shares: connection options, argument parsers, and the error contract.

Exit codes: 0 success, 1 a Kafka or usage error reported as one line on stderr (no traceback),
2 for command-line syntax errors (argparse's own).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "ONCELOG_BOOTSTRAP"


class CommandError(Exception):
    """A problem the user can fix, reported as one line and exit status 1."""


def absolute_path(text: str) -> Path:
    """An argparse type for every path option: the path made absolute against the directory the command was
    started in. Commands hand paths to child processes started elsewhere (ZooKeeper runs in its own data
    directory) and print them for the user, so a relative path must not reach either."""
    return Path(os.path.abspath(os.path.expanduser(text)))


def connection_options() -> argparse.ArgumentParser:
    """Options every client command takes (added to each leaf parser, so they may follow the command)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection and output")
    group.add_argument("--bootstrap-server", "-b", default=os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP),
                       metavar="HOST:PORT",
                       help=f"broker(s) to bootstrap from (default ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})")
    group.add_argument("--command-config", "-X", action="append", default=[], metavar="KEY=VALUE|FILE",
                       help="a client configuration property (Kafka's names), or a client.properties file "
                            "as Kafka's tools take it (security.protocol, sasl.*, ssl.* ...); repeatable")
    group.add_argument("--json", action="store_true", help="print the result as JSON, for scripts")
    group.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                       help="give up on an operation after this long (default 60)")
    return parent


def client_config(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server, "client.id": "oncelog-cli"}
    conf.update(command_config(args.command_config))
    conf.update(extra or {})
    if "request.timeout.ms" not in conf:  # so that --timeout also bounds reaching a broker at all
        conf["request.timeout.ms"] = max(1, min(30000, int(args.timeout * 1000)))
    return conf


def command_config(items: list[str]) -> dict[str, str]:
    """The settings of repeated --command-config / -X arguments, in order (a later one wins): each KEY=VALUE, or
    the path of a client.properties file. Also what `python -m oncelog.spark.demo` takes."""
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep and os.path.isfile(item):
            conf.update(_properties_file(item))
            continue
        if not sep or not key:
            raise CommandError(f"--command-config expects KEY=VALUE or a properties file, got {item!r}")
        conf[key.strip()] = value
    return conf


def _properties_file(path: str) -> dict[str, str]:
    from ..config import parse_properties

    try:
        with open(path, encoding="utf-8") as handle:
            return parse_properties(handle.read())
    except (OSError, ValueError) as exc:
        raise CommandError(f"--command-config {path}: {exc}") from None


@contextmanager
def admin_client(args: argparse.Namespace) -> Iterator[Any]:
    from ..client.admin import Admin

    admin = Admin(client_config(args), api_timeout=args.timeout)
    try:
        yield admin
    finally:
        admin.close()


def key_values(items: list[str], option: str) -> dict[str, str]:
    """['k=v', ...] -> {'k': 'v'}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"{option} expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def topic_partition(text: str) -> tuple[str, int]:
    """'TOPIC:PARTITION' (the last colon splits, so topic names stay free)."""
    topic, sep, partition = text.rpartition(":")
    if not sep or not topic or not partition.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"expected TOPIC:PARTITION, got {text!r}")
    return topic, int(partition)


def topic_partitions(text: str) -> tuple[str, list[int] | None]:
    """'TOPIC' (every partition) or 'TOPIC:P1,P2'."""
    topic, sep, rest = text.rpartition(":")
    if sep and rest and all(p.strip().isdigit() for p in rest.split(",")):
        return topic, [int(p) for p in rest.split(",")]
    return text, None


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


Handler = Callable[[argparse.Namespace], int]
