"""The `oncelog` client commands, one module per command family, on top of `oncelog.client`.

`register` adds them to the top-level parser; `run` executes the chosen one under the
CLI's error contract (common.py): a Kafka error or a usage problem is one line on stderr
and exit status 1, never a traceback. SIGTERM stops a command exactly as Ctrl-C does (interrupts.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from . import cluster, consume, coordination, groups, produce, producers, records, topics, transactions
from .common import CommandError, connection_options
from .interrupts import stop_on_signals

FAMILIES = [topics, produce, consume, records, producers, transactions, groups, coordination, cluster]


def register(sub: Any) -> None:
    common = connection_options()
    for family in FAMILIES:
        family.register(sub, common)


def run(args: argparse.Namespace) -> int:
    from ..client.errors import KafkaError

    _keep_library_logs_off_stderr()
    try:
        with stop_on_signals(take_ignored=getattr(args, "service", False)):
            return args.handler(args)
    except KafkaError as exc:
        _fail(str(exc))
    except (CommandError, ValueError) as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        print("oncelog: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `oncelog ... | head`: the reader left, nothing more to say
        return 0
    return 1


def _keep_library_logs_off_stderr() -> None:
    """The client's own log records must not reach stderr through Python's last-resort handler (which prints
    WARNING and above when nothing is configured): the client logs a failed SASL authentication, for one, and the
    same failure is then this command's error, so stderr would carry it twice. A command reports what went wrong
    itself, in one line; a program that configured logging before calling `run` keeps every record."""
    library = logging.getLogger("oncelog")
    if not logging.getLogger().handlers and not library.handlers:
        library.addHandler(logging.NullHandler())


def _fail(message: str) -> None:
    print(f"oncelog: error: {message}", file=sys.stderr)
