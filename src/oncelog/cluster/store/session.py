"""A broker's two ZooKeeper sessions and the bridge from kazoo's threads to asyncio (docs/metadata-store.md, (b)).

- The main session carries the registration and every read, watch and write.
- The seat session (docs/cluster.md §5.1): with `seat_timeout_ms`, a second, shorter session of the same broker that
  holds only /controller, so a dead controller's seat frees after that timeout rather than the broker's. It is
  opened with the main one and kept open (an election needs no connect). Without it the seat rides the main one.
- The lease of §5.4: acks=all may be acknowledged only while the main session was confirmed recently enough
  (`lease_valid`); every answer on it confirms it, and a round trip every session timeout / 3 keeps it confirmed.
- `commit`: one multi-op, measured before it is sent, and with a controller epoch behind the check of
  /controller_epoch's version, so a deposed controller's writes fail as a unit. Fencing does not depend on either
  session's timing: it is that check.

- Credentials and ACLs (store/znode_acls.py): both clients log in with the broker's ZooKeeper credentials, if it has
  any, and `open` fails with ZkAuthError when ZooKeeper refuses them; `acls(path)` is the ACL a znode created at a
  path gets (`ensure_path` creates missing parents each with its own).
- A login refused once the store has started (`mark_started`; ZooKeeper restarted with other credentials) ends that
  client's session as an expiry does (LOST, the hooks) and kazoo stops connecting for good; as Kafka's
  ZooKeeperClient on AuthFailed after its first connection, one ERROR says so and the client logs in again after a
  backoff (RELOGIN_BACKOFF_S, doubling up to a third of its session timeout, and never less), until ZooKeeper
  accepts it: the new session then takes the path of any new session (register again, re-read everything).

Threads: kazoo runs its own threads; its state and completion callbacks only hand work to the event loop
(`call_soon_threadsafe`). Calls on the loop use kazoo's `*_async` variants awaited through `call`; the few blocking
calls (starting and stopping a client) run in the default executor.

This room knows nothing of topics, brokers or which epoch the seat holds: what a change of session means for them
is its owner's business (`SessionHooks`, which the facade `cluster.metadata_store` gives).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.protocol.serialization import Transaction
from kazoo.protocol.states import KazooState, KeeperState
from kazoo.security import ACL

from . import znodes
from .errors import (
    CONNECTED,
    LOST,
    SUSPENDED,
    NotController,
    RequestTooLarge,
    StoreError,
    StoreUnavailable,
    ZkAuthError,
)
from .znode_acls import OPEN, ZkSecurity

log = logging.getLogger(__name__)

_CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError)
RELOGIN_BACKOFF_S = 1.0     # the first retry after a refused login (Kafka's ZooKeeperClient.RetryBackoffMs)

Build = Callable[[Any], None]
"""Fills a kazoo transaction (`txn.create`, `txn.set_data`, `txn.delete`, `txn.check`)."""

CheckedCommit = Callable[[Build, int | None], Awaitable[list[Any]]]
"""`commit(build, controller_epoch)`: a multi-op behind the check that this broker's controller epoch is current
(what the seat makes of `StoreSession.commit`: store/registration.py's ControllerSeat.commit), without one when None."""


class _AclTransaction:
    """A kazoo transaction whose creates get the ACL of their path (`StoreSession.acls`) unless given one: every
    multi-op of the rooms goes through `StoreSession.commit`, so none creates a znode with the wrong ACL."""

    def __init__(self, txn: Any, acls: Callable[[str], list[ACL]]) -> None:
        self._txn = txn
        self._acls = acls

    def create(self, path: str, value: bytes = b"", acl: list[ACL] | None = None, ephemeral: bool = False,
               sequence: bool = False) -> None:
        self._txn.create(path, value, self._acls(path) if acl is None else acl, ephemeral, sequence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


def _connecting(client: KazooClient) -> bool:
    """Whether kazoo's connection routine still runs: it retries connecting for ever and ends only when the client
    is stopped or its login was refused. (Its state cannot tell: it reads CLOSED both before a start's first attempt
    and after a refusal.)"""
    routine = getattr(getattr(client, "_connection", None), "_connection_routine", None)
    if routine is None or not hasattr(routine, "is_alive"):
        return client.client_state not in (KeeperState.AUTH_FAILED, KeeperState.CLOSED)
    return routine.is_alive()


def clock() -> float:
    """Seconds that keep counting while the machine is suspended (CLOCK_BOOTTIME), so a lease measured with
    it can only expire early, never late."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        try:
            return time.clock_gettime(boottime)
        except OSError:
            pass
    return time.monotonic()


@dataclass(frozen=True)
class SessionHooks:
    """What the owner of the sessions does when one changes, on the loop. The lost and replaced hooks run before
    the new state is announced to listeners, so a listener sees what they changed.

    `main_lost`: the main session expired. `main_replaced`: a new main session replaced an expired one (before
    `resync`). `resync`: after any reconnection of the main session, which dropped every watch; it reads what it
    needs again and announces CONNECTED (`StoreSession.set_state`) itself. `seat_lost` / `seat_replaced`: the same
    for the seat session."""

    main_lost: Callable[[], None]
    main_replaced: Callable[[], None]
    resync: Callable[[], Awaitable[None]]
    seat_lost: Callable[[], None]
    seat_replaced: Callable[[], None]


class StoreSession:
    """The kazoo clients of one broker, their states, the lease, and requests on them as awaitables."""

    def __init__(
        self,
        servers: str,
        root: str,
        session_timeout_ms: int,
        loop: asyncio.AbstractEventLoop,
        hooks: SessionHooks,
        seat_timeout_ms: int | None = None,
        max_multi_bytes: Callable[[], int] = lambda: znodes.MAX_MULTI_BYTES,
        security: ZkSecurity = OPEN,
    ) -> None:
        self.servers = servers
        self.security = security                 # the clients' credentials, and whether znodes get ACLs
        self.root = root                         # the chroot: every path of `path()` is under it
        self.session_timeout_ms = session_timeout_ms
        self.seat_timeout_ms = seat_timeout_ms   # None: the seat rides the main session
        self.loop = loop
        self.hooks = hooks
        self.max_multi_bytes = max_multi_bytes   # asked at each commit
        self.state = LOST
        self.seat_state = LOST
        self.negotiated_ms: dict[str, int] = {}  # "broker" / "controller" -> what ZooKeeper granted
        self._client: KazooClient | None = None
        self._session_id: int | None = None
        self._seat_client: KazooClient | None = None
        self._seat_session_id: int | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._seat_listeners: list[Callable[[str], None]] = []
        self._tasks: set[asyncio.Task] = set()
        self._confirmed_at = float("-inf")
        self._confirmed_session: int | None = None
        self._lease_task: asyncio.Task | None = None
        self._resync_task: asyncio.Task | None = None
        self._closing = False
        self._needs_resync = False
        self._started = False                    # mark_started: from then on a refused login is retried
        self._relogin_tasks: dict[str, asyncio.Task] = {}     # "broker" / "controller" -> its login retries
        self._restarting: dict[str, asyncio.Future] = {}      # a kazoo start_async a login retry runs

    # ---- what the rooms read ---------------------------------------------------------------------------------

    def path(self, rel: str) -> str:
        """A path of the layout (store/znodes.py) under the chroot."""
        return self.root + rel

    def acls(self, path: str) -> list[ACL]:
        """The ACL of a znode created at `path` (a full path, as `path()` gives; the chroot and its parents
        are judged as themselves)."""
        root = self.root
        rel = path[len(root):] if root and (path == root or path.startswith(root + "/")) else path
        return self.security.acls(rel)

    async def ensure_path(self, path: str) -> None:
        """Create `path` (a full path) and its missing parents, each with its own ACL (kazoo's ensure_path would
        give every parent the leaf's). Asks whether it exists first, as kazoo's does: a create of a znode that exists
        under a parent this login may not create in fails with NoAuthError, not NodeExistsError."""
        if path in ("", "/") or await self.call(self.kz().exists_async(path)) is not None:
            return
        try:
            await self.call(self.kz().create_async(path, b"", acl=self.acls(path)))
        except NodeExistsError:
            pass
        except NoNodeError:
            await self.ensure_path(path.rsplit("/", 1)[0])
            try:
                await self.call(self.kz().create_async(path, b"", acl=self.acls(path)))
            except NodeExistsError:
                pass

    @property
    def timeout_s(self) -> float:
        return self.session_timeout_ms / 1000.0

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def connected(self) -> bool:
        """Whether the main client is connected now (for retry loops; `state` says what was announced)."""
        return self._client is not None and self._client.connected and not self._closing

    @property
    def session_id(self) -> int | None:
        return self._session_id

    @property
    def has_seat_session(self) -> bool:
        return self.seat_timeout_ms is not None

    @property
    def seat_session_id(self) -> int | None:
        """The session that owns /controller when this broker holds it (ephemeralOwner)."""
        return self._session_id if self.seat_timeout_ms is None else self._seat_session_id

    @property
    def controller_usable(self) -> bool:
        """Whether this broker may act as controller as far as its sessions go: the main one (its registration,
        its writes) and the seat's are both CONNECTED."""
        return self.state == CONNECTED and (self.seat_timeout_ms is None or self.seat_state == CONNECTED)

    def client_id(self) -> tuple[int, bytes] | None:
        """kazoo's (session id, password) of the main session: lets a test expire it from another client."""
        return None if self._client is None else self._client.client_id

    def kz(self) -> KazooClient:
        """The main client."""
        if self._client is None:
            raise StoreUnavailable("the metadata store is not started")
        return self._client

    def seat_kz(self) -> KazooClient:
        """The client that holds /controller: the seat session's, or the main one without a seat session."""
        if self.seat_timeout_ms is None:
            return self.kz()
        if self._seat_client is None:
            raise StoreUnavailable("the metadata store is not started")
        return self._seat_client

    def require_connected(self) -> None:
        if self.state != CONNECTED or self._client is None:
            raise StoreUnavailable(f"ZooKeeper session is {self.state}")

    # ---- opening and closing ---------------------------------------------------------------------------------

    async def open(self, deadline: float, timeout_s: float) -> None:
        """Open the main session (retrying with backoff and logging while the service is unreachable). Raises
        StoreUnavailable, closed, if it did not open by `deadline` (loop time)."""
        self._client = self._new_client("broker", self.session_timeout_ms)
        self._client.add_listener(self._on_kazoo_state)
        await self.loop.run_in_executor(None, self._client.start_async)
        await self._wait_connected(self._client, deadline, timeout_s)
        await self._check_login(self._client, timeout_s)
        self._session_id = self._client.client_id[0] if self._client.client_id else None
        self._confirmed_at, self._confirmed_session = clock(), self._session_id

    async def open_seat(self, deadline: float, timeout_s: float) -> None:
        """Open the seat session, if there is one: opened now and kept open, an election is then one multi-op,
        with no connect in the way."""
        if self.seat_timeout_ms is None:
            return
        self._seat_client = self._new_client("controller", self.seat_timeout_ms)
        self._seat_client.add_listener(self._on_seat_kazoo_state)
        await self.loop.run_in_executor(None, self._seat_client.start_async)
        await self._wait_connected(self._seat_client, deadline, timeout_s)
        await self._check_login(self._seat_client, timeout_s)
        self._seat_session_id = self._seat_client.client_id[0] if self._seat_client.client_id else None
        self._set_seat_state(CONNECTED)

    def start_lease(self) -> None:
        self._lease_task = self.loop.create_task(self._confirm_loop())

    def mark_started(self) -> None:
        """The store has started: from now on a login ZooKeeper refuses is logged and retried (Kafka's
        ZooKeeperClient once its first connection was established); before, it is ZkAuthError, fatal."""
        self._started = True

    def _new_client(self, what: str, timeout_ms: int) -> KazooClient:
        """A kazoo client asking for a `timeout_ms` session. ZooKeeper grants a timeout clamped to [2, 20] ticks of
        its tickTime; the granted one is kept in `negotiated_ms[what]` and logged when it differs."""
        timeout_s = timeout_ms / 1000.0
        client = KazooClient(hosts=self.servers, timeout=timeout_s,
                             connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2,
                                               "max_delay": max(0.2, timeout_s / 6)},
                             **self.security.client_kwargs())
        connection = getattr(client, "_connection", None)
        connect = getattr(connection, "_connect", None)
        if connect is not None:
            # kazoo keeps the granted timeout to itself: its connect step returns the read timeout it derives from
            # it (2/3 of the granted timeout, in ms), which is the only place to learn it from.
            def connect_and_note(*args: Any, _connect: Any = connect) -> Any:
                result = _connect(*args)
                try:
                    granted = round(float(result[0]) * 3 / 2)
                except (TypeError, ValueError, IndexError):
                    return result
                if self.negotiated_ms.get(what) != granted and granted != timeout_ms:
                    log.warning("ZooKeeper granted a %d ms %s session for the %d ms asked (it clamps session "
                                "timeouts to 2-20 ticks of its tickTime)", granted, what, timeout_ms)
                self.negotiated_ms[what] = granted
                return result

            connection._connect = connect_and_note
        return client

    def _refused(self) -> ZkAuthError:
        return ZkAuthError(f"ZooKeeper at {self.servers} refused the login of {self.security.describe()}: "
                           "authentication failed (check the username and password against the ZooKeeper "
                           "server's JAAS Server section)")

    async def _check_login(self, client: KazooClient, timeout_s: float) -> None:
        """With credentials: one round trip, which kazoo sends only after its SASL exchange, so a refused login
        is known now (ZkAuthError, the session closed) rather than at the first write."""
        if self.security.credentials is None:
            return
        try:
            await self.call(client.exists_async("/"), timeout=timeout_s, confirms=False)
        except ZkAuthError:
            await self.close()
            raise

    async def _wait_connected(self, client: KazooClient, deadline: float, timeout_s: float) -> None:
        report_every = 1.0
        def refused() -> bool:
            # Only a login can be refused. kazoo then stops connecting for good (AUTH_FAILED, then CLOSED): a client
            # that closed while this waits, unasked, was refused.
            return (self.security.credentials is not None and not client.connected and not _connecting(client)
                    and client.client_state in (KeeperState.AUTH_FAILED, KeeperState.CLOSED))

        while not client.connected:
            if refused():
                await self.close()
                raise self._refused()
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                await self.close()
                raise StoreUnavailable(f"no ZooKeeper session with {self.servers} after {timeout_s:.0f}s")
            try:
                async with asyncio.timeout(min(remaining, report_every)):
                    while not client.connected and not refused():
                        await asyncio.sleep(0.05)
            except TimeoutError:
                log.warning("coordination service %s unreachable for %.0fs; retrying (gives up after %.0fs)",
                            self.servers, timeout_s - (deadline - self.loop.time()), timeout_s)
                report_every = 5.0

    async def close(self) -> None:
        """End both sessions (ephemeral znodes go at once) and stop kazoo's threads; no hook or listener runs."""
        self._closing = True
        for task in [self._lease_task, self._resync_task, *self._tasks, *self._relogin_tasks.values()]:
            if task is not None and not task.done():
                task.cancel()
        for starting in list(self._restarting.values()):    # a login retry's start, not to race the stop below
            try:
                await starting
            except Exception:     # noqa: BLE001 - the client is stopped next anyway
                pass
        seat, self._seat_client = self._seat_client, None
        client, self._client = self._client, None
        for kazoo in (seat, client):       # the seat first: /controller frees before the registration goes
            if kazoo is not None:
                def stop(kazoo: KazooClient = kazoo) -> None:
                    try:
                        kazoo.stop()
                    finally:
                        kazoo.close()
                await self.loop.run_in_executor(None, stop)
        self.seat_state = LOST
        self.state = LOST

    def spawn(self, work: Callable[[], Awaitable[Any]], what: str) -> None:
        """Run `work` (a re-read, mostly) as a task cancelled at close; a connection failure is left to the
        reconnection, which re-reads everything."""
        async def run() -> None:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable:
                pass
            except Exception:
                log.exception("re-reading %s after a watch failed", what)

        task = self.loop.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- requests --------------------------------------------------------------------------------------------

    async def call(self, async_result: Any, timeout: float | None = None, *, confirms: bool = True) -> Any:
        """Await a kazoo IAsyncResult on the loop; a successful answer also confirms the session (the lease),
        unless `confirms` is False (an answer on the seat session says nothing of the main one).
        A lost connection, an expired session or no answer within the session timeout is StoreUnavailable."""
        future = self.loop.create_future()
        started, session = clock(), (self._session_id if confirms else None)

        def settle(value: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(value)
                if session is not None and session == self._session_id:
                    self._confirmed_at = max(self._confirmed_at, started)
            else:
                future.set_exception(error)

        def done(result: Any) -> None:      # kazoo's thread
            try:
                value, error = result.get_nowait(), None
            except BaseException as exc:   # noqa: BLE001 - handed to the awaiting coroutine
                value, error = None, exc
            try:
                self.loop.call_soon_threadsafe(settle, value, error)
            except RuntimeError:           # the loop is closed: nobody waits any more
                pass

        async_result.rawlink(done)
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that arrives as the
            # answer does, which leaves the cancelled task running
            async with asyncio.timeout(timeout if timeout is not None else self.timeout_s):
                return await future
        except AuthFailedError as exc:
            if self._started:     # the login is retried (_relogin): meanwhile there is no session, as after a loss
                raise StoreUnavailable("ZooKeeper refused this broker's login; logging in again") from exc
            raise self._refused() from None
        except _CONNECTION_ERRORS as exc:
            raise StoreUnavailable(f"ZooKeeper request failed: {exc!r}") from exc
        except TimeoutError as exc:
            raise StoreUnavailable("ZooKeeper request timed out") from exc

    async def commit(self, build: Build, epoch: tuple[int, int] | None = None, *, seat: bool = False) -> list[Any]:
        """One multi-op. With `epoch` (a controller epoch and the version of /controller_epoch it was taken at),
        first the check that /controller_epoch is still at that version. Refused with RequestTooLarge, unsent, when
        larger than ZooKeeper takes in one request (it would drop the connection instead of answering). Returns
        the results; raises NotController when the check failed, else the first failing op's error.
        `seat`: on the seat session (the seat's own znode), else on the main session."""
        txn = _AclTransaction((self.seat_kz() if seat else self.kz()).transaction(), self.acls)
        if epoch is not None:
            txn.check(self.path(znodes.CONTROLLER_EPOCH), epoch[1])
        build(txn)
        size, limit = len(Transaction(txn.operations).serialize()), self.max_multi_bytes()
        if size > limit:
            raise RequestTooLarge(f"a {size}-byte ZooKeeper transaction of {len(txn.operations)} operations "
                                  f"(at most {limit} bytes)")
        results = await self.call(txn.commit_async(), confirms=not seat)
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return results
        if epoch is not None and isinstance(results[0], (BadVersionError, NoNodeError)):
            raise NotController(f"controller epoch {epoch[0]} is no longer current")
        first = next(r for r in failures if not isinstance(r, (RolledBackError, RuntimeInconsistency)))
        raise first

    # ---- the main session's state ----------------------------------------------------------------------------

    def on_state_change(self, listener: Callable[[str], None]) -> None:
        """`listener(state)` on the loop at each change of `state`."""
        self._listeners.append(listener)

    def set_state(self, state: str) -> None:
        """Announce `state` to the listeners (if it is a change)."""
        if state == self.state:
            return
        self.state = state
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("metadata store state listener failed")

    def _on_kazoo_state(self, state: str) -> None:    # kazoo's thread
        # kazoo sets its own state before it tells listeners: AUTH_FAILED here is why this LOST came (it reads
        # CLOSED soon after)
        refused = getattr(self._client, "client_state", None) == KeeperState.AUTH_FAILED
        try:
            self.loop.call_soon_threadsafe(self._kazoo_state_changed, state, refused)
        except RuntimeError:
            pass

    def _kazoo_state_changed(self, state: str, refused: bool = False) -> None:
        if self._closing or self._client is None or "broker" in self._relogin_tasks:
            return
        if state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection lost; session may still be alive (SUSPENDED)")
            self._needs_resync = True
            self.set_state(SUSPENDED)
        elif state == KazooState.LOST:
            if refused and not self._started:
                return      # a login refused at start: `open` (or the start's first request) says so and stops
            if refused:
                self._login_refused("broker")
            self._needs_resync = True
            self._confirmed_session = None
            self.hooks.main_lost()
            self.set_state(LOST)
        elif state == KazooState.CONNECTED and self._needs_resync:   # (the owner reads the first session itself)
            self._needs_resync = False
            client_id = self._client.client_id
            session = client_id[0] if client_id else None
            if self._resync_task is not None and not self._resync_task.done():
                self._resync_task.cancel()
            self._resync_task = self.loop.create_task(self._resync(session))

    async def _resync(self, session: int | None) -> None:
        if session != self._session_id:
            self._session_id = session
            self.hooks.main_replaced()
        self._confirmed_at, self._confirmed_session = clock(), self._session_id
        await self.hooks.resync()

    # ---- the seat session's state ----------------------------------------------------------------------------

    def on_seat_state_change(self, listener: Callable[[str], None]) -> None:
        """`listener(state)` on the loop at each change of `seat_state` (only with a seat session)."""
        self._seat_listeners.append(listener)

    def _on_seat_kazoo_state(self, state: str) -> None:    # kazoo's thread
        refused = getattr(self._seat_client, "client_state", None) == KeeperState.AUTH_FAILED
        try:
            self.loop.call_soon_threadsafe(self._seat_kazoo_state_changed, state, refused)
        except RuntimeError:
            pass

    def _seat_kazoo_state_changed(self, state: str, refused: bool = False) -> None:
        client = self._seat_client
        if self._closing or client is None or "controller" in self._relogin_tasks:
            return
        if state == KazooState.SUSPENDED:
            log.warning("controller seat session: connection lost; the session may still be alive (SUSPENDED)")
            self._set_seat_state(SUSPENDED)
        elif state == KazooState.LOST:
            if refused and not self._started:
                return
            if refused:
                self._login_refused("controller")
            self.hooks.seat_lost()
            self._set_seat_state(LOST)
        elif state == KazooState.CONNECTED:
            session = client.client_id[0] if client.client_id else None
            if session != self._seat_session_id:
                self.hooks.seat_replaced()         # a new seat session owns nothing (its /controller went with it)
                self._seat_session_id = session
            self._set_seat_state(CONNECTED)

    def _set_seat_state(self, state: str) -> None:
        if state == self.seat_state:
            return
        self.seat_state = state
        for listener in list(self._seat_listeners):
            try:
                listener(state)
            except Exception:
                log.exception("controller seat state listener failed")

    # ---- a login refused after the start ---------------------------------------------------------------------

    def _login_refused(self, what: str) -> None:
        """ZooKeeper refused the login of client `what` ("broker": the main one, "controller": the seat's) after
        the start, and kazoo has given up on it. One line says so (an ERROR for the main session, which every duty
        of the broker needs), then `_relogin` logs it in again until ZooKeeper accepts it. Until then the client's
        state changes are `_relogin`'s: kazoo announces CONNECTED before it logs in, so each refused attempt would
        otherwise come and go as a session."""
        if what in self._relogin_tasks:
            return
        timeout_s = self.timeout_s if what == "broker" else (self.seat_timeout_ms or self.session_timeout_ms) / 1000
        cap = max(RELOGIN_BACKOFF_S, timeout_s / 3)
        session = "session" if what == "broker" else "controller seat session"
        (log.error if what == "broker" else log.warning)(
            "ZooKeeper at %s refused the login of %s: authentication failed, and this broker's %s is gone "
            "(check the username and password against the ZooKeeper server's JAAS Server section); logging in "
            "again in %.0fs, then every %.0fs at most, until it is accepted",
            self.servers, self.security.describe(), session, RELOGIN_BACKOFF_S, cap)
        task = self.loop.create_task(self._relogin(what, cap, timeout_s))
        self._relogin_tasks[what] = task

        def ended(done: asyncio.Task) -> None:
            if self._relogin_tasks.get(what) is done:
                del self._relogin_tasks[what]

        task.add_done_callback(ended)

    async def _relogin(self, what: str, cap: float, timeout_s: float) -> None:
        delay, attempts = RELOGIN_BACKOFF_S, 0
        while not self._closing:
            await asyncio.sleep(delay)
            client = self._client if what == "broker" else self._seat_client
            if self._closing or client is None:
                return
            if not _connecting(client):      # kazoo gave up after the last refusal: start it again
                attempts += 1
                starting = self.loop.run_in_executor(None, client.start_async)
                self._restarting[what] = starting
                try:
                    await asyncio.shield(starting)     # cancelled (close), the start still ends before the stop
                finally:
                    self._restarting.pop(what, None)
            # kazoo connects (retrying while ZooKeeper is unreachable), then logs in; its routine ends if refused
            while not self._closing and not client.connected and _connecting(client):
                await asyncio.sleep(0.05)
            if client.connected and await self._logged_in(client, timeout_s) and client.connected:
                log.info("ZooKeeper accepted the login of %s again (%s session, after %d attempt(s))",
                         self.security.describe(), what, attempts)
                self._relogin_tasks.pop(what, None)
                # the new session takes the path of any new session: the main one registers again and re-reads
                # everything (`_resync`), the seat's is a seat that holds nothing
                if what == "broker":
                    self._kazoo_state_changed(KazooState.CONNECTED)
                else:
                    self._seat_kazoo_state_changed(KazooState.CONNECTED)
                return
            delay = min(delay * 2, cap)
            log.debug("ZooKeeper still refuses the login of %s (%s session); again in %.1fs",
                      self.security.describe(), what, delay)

    async def _logged_in(self, client: KazooClient, timeout_s: float) -> bool:
        """One round trip, answered only after kazoo's SASL exchange succeeded."""
        try:
            await self.call(client.exists_async("/"), timeout=timeout_s, confirms=False)
        except (StoreError, KazooException):
            return False
        return True

    # ---- the lease -------------------------------------------------------------------------------------------

    def lease_valid(self) -> bool:
        """Whether acks=all may still be acknowledged (docs/cluster.md §5.4): the session is not known lost and
        the last confirmed round trip started less than session timeout × 2/3 ago. ZooKeeper cannot expire the
        session before a full session timeout after it last heard from us, which is after that start."""
        if self.state == LOST or self._confirmed_session is None or self._confirmed_session != self._session_id:
            return False
        return clock() - self._confirmed_at < self.timeout_s * 2 / 3

    async def _confirm_loop(self) -> None:
        """Confirm the session every session timeout / 3 (the lease's heartbeat)."""
        interval = self.timeout_s / 3
        while not self._closing:
            await asyncio.sleep(interval)
            if self._client is None or not self._client.connected:
                continue
            try:
                await self.call(self.kz().exists_async(self.path(znodes.CONTROLLER_EPOCH)), timeout=interval)
            except (KazooException, StoreError):
                pass
