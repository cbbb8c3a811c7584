"""Change notifications: how a broker hears that another changed ACLs or a config entity (Kafka's
ZkNodeChangeNotificationListener).

A writer changes the znode and, in the same multi-op, creates a sequential notification under a parent
(/kafka-acl-changes/acl_changes_0000000042) naming what changed. Every broker watches the parent's children; when
they change, it reads each notification newer than the last it handled, in sequence order, and hands its data to
its owner (`on_notice`), which re-reads what the notification names. Notifications older than
CHANGE_EXPIRATION_MS are deleted by whichever broker sees them.

The owner's full read and the notices are serialized by the owner's lock: `mark()` (under that lock, before the
owner's full read) lists the parent and sets the watch, and takes its newest notification as handled, since the
read that follows sees every change made before it. A change made after the listing has a newer notification,
which the watch brings. Notices are idempotent re-reads, so one seen twice does no harm.

Watches: kazoo's thread only hands the event to the loop, where the processing runs as a task of the session (a
read that fails on a lost connection is left to the reconnection, whose resync reads everything and marks again).

Writers use `update`: read the znodes a change touches with their versions, build one multi-op from them (the
znodes set, created or deleted at the versions read, and the notifications), commit; a lost compare-and-set reads
again and retries after a short random backoff, as Kafka's AclAuthorizer did (MAX_UPDATE_RETRIES). A change and
its notification are one multi-op, so no broker can miss a change that was made. Each store also writes one
change at a time (its own lock), as AclAuthorizer's write lock did, so races are only between brokers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.protocol.states import EventType

from .errors import NotStored, StoreError
from .session import StoreSession
from .znodes import CHANGE_EXPIRATION_MS

log = logging.getLogger(__name__)

MAX_UPDATE_RETRIES = 10   # Kafka's AclAuthorizer.maxUpdateRetries: a change that lost this many races in a row fails
RETRY_BACKOFF_S = (0.02, 0.1)   # a random wait in this range after a lost race (AclAuthorizer: 100 ms + jitter)


class Versioned(NamedTuple):
    """A znode as read for a compare-and-set: its data and version, or `exists` False (version -1)."""

    data: bytes
    version: int
    exists: bool


ABSENT = Versioned(b"", -1, False)

Plan = Callable[[Mapping[str, Versioned]], Callable[[Any], None] | None]
"""Given the znodes read (by path relative to the chroot), what to write: a function filling a kazoo transaction,
or None when nothing needs writing."""


async def read_versioned(session: StoreSession, rel: str) -> Versioned:
    try:
        data, stat = await session.call(session.kz().get_async(session.path(rel)))
    except NoNodeError:
        return ABSENT
    return Versioned(data or b"", stat.version, True)


async def update(session: StoreSession, paths: Sequence[str], plan: Plan, what: str) -> Mapping[str, Versioned]:
    """Read `paths`, commit what `plan` makes of them, read again and retry after a lost compare-and-set. Returns
    the reads the committed multi-op was built on ({} when `plan` had nothing to write). NotStored when it could
    not be written."""
    try:
        for _ in range(MAX_UPDATE_RETRIES):
            reads = dict(zip(paths, await asyncio.gather(*(read_versioned(session, p) for p in paths)), strict=True))
            build = plan(reads)
            if build is None:
                return {}
            try:
                await session.commit(build)
            except (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError):
                # another broker changed a znode since it was read: read again, after a wait that lets it finish
                await asyncio.sleep(random.uniform(*RETRY_BACKOFF_S))
                continue
            return reads
    except (StoreError, KazooException) as exc:
        raise NotStored(f"could not store {what} in ZooKeeper: {exc}") from exc
    raise NotStored(f"could not store {what} in ZooKeeper: it changed under {MAX_UPDATE_RETRIES} attempts in a row")


def add_notice(session: StoreSession, txn: Any, parent: str, prefix: str, data: bytes) -> None:
    """Add a notification (a sequential znode under `parent`) to a multi-op."""
    txn.create(session.path(f"{parent}/{prefix}"), data, sequence=True)


def sequence_of(name: str, prefix: str) -> int | None:
    """The sequence number of a notification's name (acl_changes_0000000042 -> 42), None for another name."""
    if not name.startswith(prefix) or not name[len(prefix):].isdigit():
        return None
    return int(name[len(prefix):])


class ChangeNotifications:
    """One notification parent, followed for its owner (see the module docstring)."""

    def __init__(self, session: StoreSession, parent: str, prefix: str, lock: asyncio.Lock,
                 on_notice: Callable[[bytes], Awaitable[None]],
                 expiration_ms: int = CHANGE_EXPIRATION_MS) -> None:
        self.session = session
        self.parent = parent                 # relative to the chroot: /kafka-acl-changes
        self.prefix = prefix
        self.lock = lock
        self.on_notice = on_notice
        self.expiration_ms = expiration_ms
        self.last = -1                       # the newest notification handled (or covered by a full read)
        self._ctimes: dict[str, int] = {}    # notification name -> its creation time (ms), once known
        self._watch = self._on_watch         # one callable: kazoo keeps a set of watchers per path

    async def mark(self) -> None:
        """Under the owner's lock, before its full read: set the watch and take every notification there now
        as handled (the full read covers them)."""
        names = await self._list()
        newest = max((s for s in (sequence_of(n, self.prefix) for n in names) if s is not None), default=-1)
        self.last = max(self.last, newest)
        await self._purge(names)

    async def process(self) -> None:
        """Handle every notification newer than the last handled, in order; set the watch again."""
        async with self.lock:
            names = await self._list()
            pending = sorted((s, n) for n in names if (s := sequence_of(n, self.prefix)) is not None and s > self.last)
            for seq, name in pending:
                try:
                    data, stat = await self.session.call(self.session.kz().get_async(self._path(name)))
                except NoNodeError:
                    continue                 # purged: older than every broker needed it
                self._ctimes[name] = stat.ctime
                try:
                    await self.on_notice(data or b"")
                except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
                    log.warning("ignoring the malformed change notification %s%s/%s: %s", self.session.root,
                                self.parent, name, exc)
                self.last = seq
            await self._purge(names)

    async def _list(self) -> list[str]:
        try:
            return list(await self.session.call(self.session.kz().get_children_async(
                self.session.path(self.parent), watch=self._watch)))
        except NoNodeError:
            return []

    def _path(self, name: str) -> str:
        return self.session.path(f"{self.parent}/{name}")

    async def _purge(self, names: list[str]) -> None:
        """Delete the handled notifications older than the expiration (any broker may; a delete another broker
        made first is no error)."""
        present = set(names)
        self._ctimes = {n: t for n, t in self._ctimes.items() if n in present}
        now_ms = time.time() * 1000
        for name in names:
            seq = sequence_of(name, self.prefix)
            if seq is None or seq > self.last:
                continue
            ctime = self._ctimes.get(name)
            if ctime is None:
                stat = await self.session.call(self.session.kz().exists_async(self._path(name)))
                if stat is None:
                    continue
                ctime = self._ctimes[name] = stat.ctime
            if now_ms - ctime > self.expiration_ms:
                try:
                    await self.session.call(self.session.kz().delete_async(self._path(name)))
                except (NoNodeError, NotEmptyError):
                    pass
                self._ctimes.pop(name, None)

    def _on_watch(self, event: Any) -> None:       # kazoo's thread
        if event.type == EventType.NONE:
            return                                  # a disconnect: the reconnection reads everything again
        try:
            self.session.loop.call_soon_threadsafe(self._fire)
        except RuntimeError:
            pass

    def _fire(self) -> None:
        if not self.session.closing:
            self.session.spawn(self.process, self.parent)
