"""Ctrl-C (SIGINT) and SIGTERM stop a client command the same way.

Python turns SIGINT into KeyboardInterrupt, and every command's Ctrl-C path cleans up: `consume` commits what
it printed and leaves its group (LeaveGroup, so the group rebalances at once instead of after the member's
session timeout), `produce` flushes what it accepted or aborts its transaction. SIGTERM, what `kill`, systemd,
Docker and Kubernetes send, would end the process on the spot and skip all of that. While a client command runs
both signals raise KeyboardInterrupt in the main thread, so SIGTERM takes the Ctrl-C path and exits with the
same status. A signal the process was started with ignored (SIG_IGN, e.g. SIGINT of a background job) stays
ignored for a client command: `consume ... &` in a script keeps the shell's choice. A command that runs a service
in the foreground (`cluster start`, `coordination start`: set_defaults(service=True)) takes both signals whatever
it inherited, as `oncelog serve` does (its own handlers, cli.py): a service started with `&` from a script would
otherwise ignore `kill -INT` and leave SIGTERM as the only clean stop, and the two ways to run a node must not
disagree about how to stop one.

`deferred()` marks work that must not be cut in the middle (taking records from the consumer and printing
them): the first signal inside it is held until the block ends and raised there; a second one raises at once,
for a command stuck inside the block.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    deferring = False
    pending = False


_state = _State()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if _state.deferring and not _state.pending:
        _state.pending = True
        return
    raise KeyboardInterrupt


@contextmanager
def stop_on_signals(take_ignored: bool = False) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise KeyboardInterrupt (main thread only); restored after.

    An inherited SIG_IGN is kept unless `take_ignored` (a service: see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is None or (current is signal.SIG_IGN and not take_ignored):  # not set from Python, or
            continue                                                            # ignored by choice
        previous[sig] = current
        signal.signal(sig, _interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """A signal arriving inside the block raises KeyboardInterrupt when the block ends (a second one at once).

    An exception leaving the block wins over a held signal."""
    _state.pending = False
    _state.deferring = True
    try:
        yield
    finally:
        # Stop deferring before reading `pending`: a signal in between then raises by itself, none is lost.
        _state.deferring = False
        pending, _state.pending = _state.pending, False
    if pending:
        raise KeyboardInterrupt
