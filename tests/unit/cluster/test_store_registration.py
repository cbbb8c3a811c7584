"""The decisions of cluster/store/registration.py without ZooKeeper: which live registration is this broker's own
(waited out) and which is another broker's (refused), and how the controller seat fences its writes: the epoch it
holds goes into every controller multi-op's check, a failed check forgets the seat, a lost session gives it up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError

from oncelog.cluster.metadata_image import MetadataImage
from oncelog.cluster.store.errors import NotController
from oncelog.cluster.store.registration import ControllerSeat, Registration, same_broker


def reg(instance_id: str | None = None, host: str = "10.0.0.1", port: int = 9092) -> Registration:
    return Registration(1, host, port, None, instance_id, {})


def test_a_registration_with_the_same_storage_is_this_brokers_own_wherever_it_listens():
    assert same_broker({"host": "10.0.0.9", "port": 9093, "instance_id": "disk-a"}, reg("disk-a"))
    assert not same_broker({"host": "10.0.0.1", "port": 9092, "instance_id": "disk-b"}, reg("disk-a"))
    assert not same_broker({"host": "10.0.0.1", "port": 9092}, reg("disk-a"))      # an older broker's, no id


def test_without_an_instance_id_the_address_decides():
    assert same_broker({"host": "10.0.0.1", "port": 9092, "instance_id": "disk-b"}, reg())
    assert not same_broker({"host": "10.0.0.1", "port": 9093}, reg())


class FakeSession:
    """What ControllerSeat uses of StoreSession in these tests: commit (recorded, answered by `outcome`), spawn."""

    def __init__(self, has_seat_session: bool = True) -> None:
        self.has_seat_session = has_seat_session
        self.commits: list[tuple[Any, bool]] = []
        self.outcome: BaseException | None = None
        self.spawned: list[str] = []

    async def commit(self, build: Any, epoch: tuple[int, int] | None = None, *, seat: bool = False) -> list[Any]:
        self.commits.append((epoch, seat))
        if self.outcome is not None:
            raise self.outcome
        return ["done"]

    def spawn(self, work: Any, what: str) -> None:
        self.spawned.append(what)


def seat_over(session: FakeSession, held: tuple[int, int] | None) -> ControllerSeat:
    async def read_controller() -> None:
        pass

    seat = ControllerSeat(session, MetadataImage(), read_controller)  # a FakeSession for a StoreSession
    seat.held = held
    return seat


def test_a_controller_write_carries_the_version_of_the_epoch_held():
    async def body() -> None:
        session = FakeSession()
        seat = seat_over(session, (5, 17))
        assert await seat.commit(lambda txn: None, 5) == ["done"]
        assert await seat.commit(lambda txn: None, None, seat=True) == ["done"]
        assert session.commits == [((5, 17), False), (None, True)]

    asyncio.run(body())


def test_an_epoch_not_held_writes_nothing():
    async def body() -> None:
        session = FakeSession()
        for held in (None, (6, 20)):
            with pytest.raises(NotController, match="controller epoch 5 is not held by this broker"):
                await seat_over(session, held).commit(lambda txn: None, 5)
        assert session.commits == []

    asyncio.run(body())


def test_a_failed_epoch_check_forgets_the_seat_another_failure_does_not():
    async def body() -> None:
        session = FakeSession()
        seat = seat_over(session, (5, 17))
        session.outcome = BadVersionError()
        with pytest.raises(BadVersionError):
            await seat.commit(lambda txn: None, 5)
        assert seat.epoch == 5
        session.outcome = NotController("controller epoch 5 is no longer current")
        with pytest.raises(NotController):
            await seat.commit(lambda txn: None, 5)
        assert seat.epoch is None and seat.held is None

    asyncio.run(body())


def test_a_lost_broker_session_gives_the_seat_up():
    session = FakeSession(has_seat_session=True)
    seat = seat_over(session, (5, 17))
    seat.main_session_lost()
    assert seat.epoch is None and session.spawned == ["the controller seat"]   # freed: the seat session lives on
    seat.main_session_lost()
    assert session.spawned == ["the controller seat"]                          # nothing held, nothing to free

    alone = FakeSession(has_seat_session=False)
    seat = seat_over(alone, (5, 17))
    seat.main_session_lost()
    assert seat.epoch is None and alone.spawned == []                          # /controller went with the session
