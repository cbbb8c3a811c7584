"""The sessions of cluster metadata (cluster/store/session.py) without ZooKeeper: kazoo's client is replaced (the one
fake seam, `_new_client`), its transactions are kazoo's own. What is checked: answers bridged to the loop and the
lease they confirm, failures as StoreUnavailable, a multi-op behind the controller-epoch check and its size bound,
which session a commit goes on, and that a change of session reaches the owner's hooks before the listeners."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.client import TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import KazooState

from oncelog.cluster.store import session as session_module
from oncelog.cluster.store.errors import (
    CONNECTED,
    LOST,
    SUSPENDED,
    NotController,
    RequestTooLarge,
    StoreUnavailable,
)
from oncelog.cluster.store.session import SessionHooks, StoreSession

SESSION_MS = 6000          # the lease: 4 s after the start of the last confirmed round trip


class Answer:
    """A kazoo IAsyncResult, answered by `settle` (kazoo's thread would)."""

    def __init__(self) -> None:
        self._callbacks: list[Any] = []
        self._outcome: tuple[Any, BaseException | None] | None = None

    def rawlink(self, callback: Any) -> None:
        self._callbacks.append(callback)
        if self._outcome is not None:
            callback(self)

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        self._outcome = (value, error)
        for callback in self._callbacks:
            callback(self)

    def get_nowait(self) -> Any:
        assert self._outcome is not None
        value, error = self._outcome
        if error is not None:
            raise error
        return value


def answered(value: Any = None, error: BaseException | None = None) -> Answer:
    answer = Answer()
    answer.settle(value, error)
    return answer


class FakeKazoo:
    """What StoreSession uses of a KazooClient; a multi-op answers the next of `results`."""

    chroot = ""
    default_acl = None
    logger = logging.getLogger("kazoo.client")

    def __init__(self, session_id: int, connected: bool = True) -> None:
        self.client_id = (session_id, b"password")
        self.connected = connected
        self.handler = SimpleNamespace(async_result=Answer)
        self.listeners: list[Any] = []
        self.sent: list[Any] = []
        self.results: list[list[Any]] = []
        self.stopped = False

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def fire(self, state: str) -> None:
        """kazoo telling of a change of state, from its thread."""
        for listener in self.listeners:
            listener(state)

    def start_async(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        pass

    def transaction(self) -> TransactionRequest:
        return TransactionRequest(self)

    def _call(self, request: Any, answer: Answer) -> None:    # what TransactionRequest.commit_async sends through
        self.sent.append(request)
        answer.settle(self.results.pop(0))

    def exists_async(self, path: str) -> Answer:
        return answered(None)


class Session(StoreSession):
    """A StoreSession over fake clients, handed out in the order they are asked for (main, then seat)."""

    def __init__(self, *clients: FakeKazoo, hooks: SessionHooks | None = None, seat_timeout_ms: int | None = None,
                 limit: int = 1_000_000) -> None:
        super().__init__("zk:2181", "/root", SESSION_MS, asyncio.get_running_loop(), hooks or quiet_hooks(),
                         seat_timeout_ms, max_multi_bytes=lambda: limit)
        self._fakes = list(clients)

    def _new_client(self, what: str, timeout_ms: int) -> Any:
        return self._fakes.pop(0)


def quiet_hooks() -> SessionHooks:
    async def resync() -> None:
        pass

    return SessionHooks(main_lost=lambda: None, main_replaced=lambda: None, resync=resync, seat_lost=lambda: None,
                        seat_replaced=lambda: None)


async def opened(*clients: FakeKazoo, **kwargs: Any) -> Session:
    session = Session(*clients, **kwargs)
    deadline = asyncio.get_running_loop().time() + 5
    await session.open(deadline, 5)
    await session.open_seat(deadline, 5)
    session.set_state(CONNECTED)            # what the owner announces once it has read the image
    return session


async def ticks() -> None:
    """Let the loop run what kazoo's threads handed it (a state change, then the task it starts)."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
def now(monkeypatch) -> list[float]:
    clock = [1000.0]
    monkeypatch.setattr(session_module, "clock", lambda: clock[0])
    return clock


def test_an_answer_confirms_the_lease_of_the_main_session_only(now):
    async def body() -> None:
        session = await opened(FakeKazoo(0x11))
        assert session.lease_valid()                             # confirmed when it opened
        now[0] += 4.1
        assert not session.lease_valid()
        assert await session.call(answered("seat"), confirms=False) == "seat"
        assert not session.lease_valid()                         # an answer on the seat says nothing of this one
        assert await session.call(answered("main")) == "main"
        assert session.lease_valid()                             # from the start of that round trip
        now[0] += 3.9
        assert session.lease_valid()
        now[0] += 0.2
        assert not session.lease_valid()

    asyncio.run(body())


def test_a_failed_request_is_store_unavailable_and_an_answer_passes_through():
    async def body() -> None:
        session = await opened(FakeKazoo(0x11))
        with pytest.raises(StoreUnavailable, match="request failed"):
            await session.call(answered(error=ConnectionLoss()))
        with pytest.raises(StoreUnavailable, match="timed out"):
            await session.call(Answer(), timeout=0.05)
        with pytest.raises(NoNodeError):
            await session.call(answered(error=NoNodeError()))

    asyncio.run(body())


def test_a_commit_behind_an_epoch_checks_controller_epoch_first():
    async def body() -> None:
        main = FakeKazoo(0x11)
        session = await opened(main)
        main.results.append([True, "stat"])
        results = await session.commit(lambda txn: txn.set_data("/root/topics/t", b"v", version=3), (7, 42))
        assert results == [True, "stat"]
        check, write = main.sent[0].operations
        assert (check.path, check.version) == ("/root/controller_epoch", 42)
        assert (write.path, write.version) == ("/root/topics/t", 3)
        main.results.append(["stat"])
        await session.commit(lambda txn: txn.delete("/root/brokers/ids/2"))
        assert [op.path for op in main.sent[1].operations] == ["/root/brokers/ids/2"]    # no check without one

    asyncio.run(body())


def test_a_failed_check_is_not_controller_else_the_failing_operation_is_raised():
    async def body() -> None:
        main = FakeKazoo(0x11)
        session = await opened(main)

        def build(txn: Any) -> None:
            txn.create("/root/a", b"")
            txn.create("/root/b", b"")

        main.results.append([BadVersionError(), RuntimeInconsistency(), RuntimeInconsistency()])
        with pytest.raises(NotController, match="controller epoch 7 is no longer current"):
            await session.commit(build, (7, 42))
        main.results.append([RolledBackError(), NodeExistsError(), RuntimeInconsistency()])
        with pytest.raises(NodeExistsError):
            await session.commit(build, (7, 42))
        main.results.append([BadVersionError(), RuntimeInconsistency()])
        with pytest.raises(BadVersionError):                     # without an epoch, the first op is just an op
            await session.commit(build)

    asyncio.run(body())


def test_a_commit_larger_than_one_request_is_refused_unsent():
    async def body() -> None:
        main = FakeKazoo(0x11)
        session = await opened(main, limit=300)
        with pytest.raises(RequestTooLarge, match="at most 300 bytes"):
            await session.commit(lambda txn: txn.create("/root/big", b"x" * 300))
        assert main.sent == []

    asyncio.run(body())


def test_the_seat_commits_on_its_own_session_or_on_the_main_one_without():
    async def body() -> None:
        main, seat = FakeKazoo(0x11), FakeKazoo(0x22)
        session = await opened(main, seat, seat_timeout_ms=2000)
        assert (session.session_id, session.seat_session_id, session.seat_state) == (0x11, 0x22, CONNECTED)
        seat.results.append(["stat"])
        await session.commit(lambda txn: txn.delete("/root/controller"), seat=True)
        assert len(seat.sent) == 1 and main.sent == []
        await session.close()
        assert main.stopped and seat.stopped and (session.state, session.seat_state) == (LOST, LOST)

        alone = FakeKazoo(0x33)
        session = await opened(alone)
        assert session.seat_session_id == session.session_id == 0x33
        alone.results.append(["stat"])
        await session.commit(lambda txn: txn.delete("/root/controller"), seat=True)
        assert len(alone.sent) == 1

    asyncio.run(body())


def test_a_change_of_session_reaches_the_owner_before_the_listeners():
    async def body() -> None:
        events: list[Any] = []
        main, seat = FakeKazoo(0x11), FakeKazoo(0x22)

        async def resync() -> None:
            events.append("resync")
            session.set_state(CONNECTED)

        hooks = SessionHooks(main_lost=lambda: events.append(("main_lost", session.state)),
                             main_replaced=lambda: events.append(("main_replaced", session.session_id)),
                             resync=resync,
                             seat_lost=lambda: events.append(("seat_lost", session.seat_state)),
                             seat_replaced=lambda: events.append(("seat_replaced", session.seat_session_id)))
        session = await opened(main, seat, hooks=hooks, seat_timeout_ms=2000)
        session.on_state_change(lambda state: events.append(("main", state)))
        session.on_seat_state_change(lambda state: events.append(("seat", state)))

        main.fire(KazooState.SUSPENDED)
        main.fire(KazooState.CONNECTED)                          # the same session: the watches are read again
        await ticks()
        assert events == [("main", SUSPENDED), "resync", ("main", CONNECTED)]
        events.clear()
        main.fire(KazooState.LOST)
        await ticks()
        assert events == [("main_lost", CONNECTED), ("main", LOST)] and not session.lease_valid()
        events.clear()
        main.client_id = (0x12, b"password")
        main.fire(KazooState.CONNECTED)
        await ticks()
        assert events == [("main_replaced", 0x12), "resync", ("main", CONNECTED)] and session.lease_valid()
        events.clear()

        seat.fire(KazooState.LOST)
        seat.client_id = (0x23, b"password")
        seat.fire(KazooState.CONNECTED)
        await ticks()
        assert events == [("seat_lost", CONNECTED), ("seat", LOST), ("seat_replaced", 0x22), ("seat", CONNECTED)]
        assert session.seat_session_id == 0x23

    asyncio.run(body())


def test_no_session_by_the_deadline_is_store_unavailable():
    async def body() -> None:
        unreachable = FakeKazoo(0x11, connected=False)
        session = Session(unreachable)
        with pytest.raises(StoreUnavailable, match="no ZooKeeper session with zk:2181"):
            await session.open(asyncio.get_running_loop().time() + 0.2, 0.2)
        assert unreachable.stopped and session.closing

    asyncio.run(body())
