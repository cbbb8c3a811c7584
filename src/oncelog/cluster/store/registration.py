"""This broker's registration and the controller seat (docs/metadata-store.md, (c) and (d)).

- The registration is the ephemeral /brokers/ids/<node.id> of the main session; its czxid is the broker epoch, so
  registering again (after a new session, or after a controller removed it, cluster/crash_probe.py) makes a new
  incarnation that the controller treats as a restart. A controller expires a stale one by deleting it, behind
  its epoch check.
- The seat is the ephemeral /controller of the seat session, created together with the increment of
  /controller_epoch in one transaction. The seat keeps (epoch, /controller_epoch's version) while it is held: every
  controller write goes through `ControllerSeat.commit`, which checks that version in the same multi-op, so a
  deposed controller's writes fail as a unit.

Neither reads the image's other znodes: after a write they ask for the re-read they need (`read_broker`,
`read_controller`, store/loader.py's, given by the facade).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from ..metadata_image import BrokerInfo, MetadataImage
from . import znodes
from .errors import BrokerIdInUse, NotController, StoreError, StoreUnavailable
from .session import Build, CheckedCommit, StoreSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    node_id: int
    host: str
    port: int
    rack: str | None
    instance_id: str | None
    extra: dict[str, Any]


def same_broker(held: Mapping[str, Any], reg: Registration) -> bool:
    """Whether a live registration `held` (its znode's value) was left by a previous session of the broker `reg`
    describes: the same storage (instance id) or, for a broker without one, the same host:port. Such a registration
    is waited out; any other is a second broker with the same node.id."""
    if reg.instance_id is not None:
        return held.get("instance_id") == reg.instance_id
    return (held.get("host"), held.get("port")) == (reg.host, reg.port)


class BrokerRegistration:
    """/brokers/ids/<node.id> of this broker: register, renew after a new session, and a controller's expiry of
    another broker's."""

    def __init__(self, session: StoreSession, image: MetadataImage, read_broker: Callable[[int], Awaitable[None]],
                 commit: CheckedCommit) -> None:
        self.session = session
        self.image = image
        self._read_broker = read_broker
        self._commit = commit
        self.broker_epoch: int | None = None
        self.keep_registered = True      # False once the broker is leaving: a removed registration stays removed
        self._registration: Registration | None = None
        self._registered_session: int | None = None
        self._renewing = False

    async def register(self, node_id: int, host: str, port: int, rack: str | None = None, *,
                       instance_id: str | None = None, extra: Mapping[str, Any] | None = None) -> int:
        """Create /brokers/ids/<node_id> (ephemeral) and return the broker epoch (its czxid).

        `instance_id` names this broker's storage (the same across restarts). A registration left by a previous
        session of the same broker (`same_broker`) is waited out, at most the session timeout plus one second, as
        after a kill -9; any other live registration raises BrokerIdInUse naming its host:port."""
        self.session.require_connected()
        reg = Registration(node_id, host, port, rack, instance_id, dict(extra or {}))
        epoch = await self._register(reg)
        self._registration = reg
        return epoch

    async def renew_after_new_session(self) -> None:
        """Register again if registered under an earlier session (it expired, and the registration with it)."""
        if self._registration is not None and self._registered_session != self.session.session_id:
            await self._register(self._registration)

    def removed(self, node_id: int) -> None:
        """A watch saw /brokers/ids/<node_id> gone: if it was this broker's, under this session, register again."""
        reg = self._registration
        if reg is not None and reg.node_id == node_id and self._registered_session == self.session.session_id:
            self.session.spawn(self._renew, "this broker's registration")

    def session_lost(self) -> None:
        self.broker_epoch = None

    def forget(self) -> None:
        """The sessions are closed: nothing is registered, nor will be again."""
        self._registration = None
        self.broker_epoch = None

    async def _renew(self) -> None:
        """This broker's registration was deleted while its session lives: by a controller that took it for dead
        (cluster/crash_probe.py), or by hand. Registering again gives it a new broker epoch, which the controller
        treats as a restart; a broker that is leaving stays gone."""
        reg = self._registration
        if (self._renewing or reg is None or not self.keep_registered or self.session.closing
                or self._registered_session != self.session.session_id):
            return
        self._renewing = True
        try:
            log.warning("the registration of node.id %d was removed while this broker's session is alive; "
                        "registering again", reg.node_id)
            await self._register(reg)
        finally:
            self._renewing = False

    async def _register(self, reg: Registration) -> int:
        session = self.session
        path = session.path(f"{znodes.BROKERS}/{reg.node_id}")
        value = znodes.dump({"host": reg.host, "port": reg.port, "rack": reg.rack, "instance_id": reg.instance_id,
                             "timestamp": int(time.time() * 1000), **reg.extra})
        deadline: float | None = None
        while True:
            try:
                _, stat = await session.call(session.kz().create_async(path, value, acl=session.acls(path),
                                                                           ephemeral=True, include_data=True))
                break
            except NodeExistsError:
                pass
            try:
                data, stat = await session.call(session.kz().get_async(path))
            except NoNodeError:
                continue
            if stat.ephemeralOwner == session.session_id:     # ours already (a create answered after a reconnect)
                break
            held = znodes.load(data)
            where = f"{held.get('host')}:{held.get('port')}"
            if not same_broker(held, reg):
                raise BrokerIdInUse(f"node.id {reg.node_id} is registered by a live broker at {where}")
            now = session.loop.time()
            if deadline is None:
                deadline = now + session.timeout_s + 1.0
                log.warning("node.id %d is still registered by a previous session of this broker (%s); waiting up "
                            "to %.1fs for ZooKeeper to expire it", reg.node_id, where, deadline - now)
            if now >= deadline:
                raise BrokerIdInUse(f"node.id {reg.node_id} is registered by a live broker at {where} "
                                    f"(its session did not expire within {session.timeout_s:.1f}s)")
            await asyncio.sleep(min(0.2, max(0.01, deadline - now)))
        self.broker_epoch = stat.czxid
        self._registered_session = session.session_id
        self.image.apply_broker(BrokerInfo(reg.node_id, reg.host, reg.port, reg.rack, stat.czxid,
                                           znodes.endpoints_from(reg.extra)))
        log.info("registered node.id %d at %s:%d, broker epoch %d", reg.node_id, reg.host, reg.port, stat.czxid)
        await self._read_broker(reg.node_id)          # arms the watch on our own registration
        return stat.czxid

    async def expire(self, node_id: int, broker_epoch: int, controller_epoch: int) -> bool:
        """Delete broker `node_id`'s registration if it is still the incarnation `broker_epoch` (its czxid), as
        this controller: its death then takes the path of a session expiry. Returns whether it was deleted."""
        session = self.session
        path = session.path(f"{znodes.BROKERS}/{node_id}")
        try:
            _, stat = await session.call(session.kz().get_async(path))
        except NoNodeError:
            return False
        if stat.czxid != broker_epoch:
            return False

        def build(txn: Any) -> None:
            txn.delete(path, version=stat.version)

        try:
            await self._commit(build, controller_epoch)
        except (NoNodeError, BadVersionError):
            return False
        return True


class ControllerSeat:
    """/controller on the seat session, and the epoch this broker holds with it."""

    def __init__(self, session: StoreSession, image: MetadataImage,
                 read_controller: Callable[[], Awaitable[None]]) -> None:
        self.session = session
        self.image = image
        self._read_controller = read_controller
        self.held: tuple[int, int] | None = None     # (controller epoch, /controller_epoch znode version)

    @property
    def epoch(self) -> int | None:
        """The controller epoch this broker holds, or None."""
        return None if self.held is None else self.held[0]

    async def commit(self, build: Build, controller_epoch: int | None, *, seat: bool = False) -> list[Any]:
        """One multi-op (StoreSession.commit); with `controller_epoch`, behind the check that this controller's
        epoch is current. Raises NotController when this broker does not hold that epoch, or when the check failed
        (the seat is then forgotten), else the first failing op's error. `seat`: on the seat session."""
        held = None
        if controller_epoch is not None:
            held = self.held
            if held is None or held[0] != controller_epoch:
                raise NotController(f"controller epoch {controller_epoch} is not held by this broker")
        try:
            return await self.session.commit(build, held, seat=seat)
        except NotController:
            self.held = None
            raise

    async def try_take(self, node_id: int, broker_epoch: int) -> int | None:
        """Take /controller if it is free, and bump /controller_epoch in the same transaction, on the seat session.
        Returns the new controller epoch, or None when another broker holds the seat."""
        session = self.session
        session.require_connected()
        if not session.controller_usable:
            raise StoreUnavailable(f"controller seat session is {session.seat_state}")
        for _ in range(10):
            data, stat = await session.call(session.kz().get_async(session.path(znodes.CONTROLLER_EPOCH)))
            epoch = int(znodes.load(data)["controller_epoch"]) + 1

            def build(txn: Any, epoch: int = epoch, version: int = stat.version) -> None:
                txn.create(session.path(znodes.CONTROLLER),
                           znodes.dump({"broker_id": node_id, "broker_epoch": broker_epoch, "controller_epoch": epoch,
                                        "timestamp": int(time.time() * 1000)}), ephemeral=True)
                txn.set_data(session.path(znodes.CONTROLLER_EPOCH), znodes.dump({"controller_epoch": epoch}),
                             version=version)

            try:
                results = await self.commit(build, None, seat=True)
            except NodeExistsError:
                await self._read_controller()
                return None
            except BadVersionError:
                continue                              # the epoch moved under us: read it again
            self.held = (epoch, results[1].version)
            self.image.apply_controller(node_id, epoch)
            log.info("node.id %d is the controller, epoch %d", node_id, epoch)
            return epoch
        return None

    async def resign(self, controller_epoch: int) -> None:
        """Give the seat up (delete /controller) if this broker still holds it at `controller_epoch`."""
        if self.held is None or self.held[0] != controller_epoch:
            return
        try:
            await self.commit(lambda txn: txn.delete(self.session.path(znodes.CONTROLLER)), controller_epoch,
                              seat=True)
        except (StoreError, KazooException):
            pass
        self.held = None

    async def still_held(self) -> bool:
        """After a reconnection: whether /controller is still this broker's (its ephemeralOwner is the seat
        session) at the epoch it set (/controller_epoch at the version it wrote). If not, the seat is given up
        here (`epoch` becomes None)."""
        session = self.session
        held = self.held
        if held is None:
            return False
        try:
            _, seat = await session.call(session.kz().get_async(session.path(znodes.CONTROLLER)))
            _, epoch = await session.call(session.kz().get_async(session.path(znodes.CONTROLLER_EPOCH)))
        except NoNodeError:
            seat = epoch = None
        if (seat is None or epoch is None or seat.ephemeralOwner != session.seat_session_id
                or epoch.version != held[1]):
            if self.held == held:
                self.held = None
            return False
        return True

    async def release(self) -> bool:
        """Delete /controller if the seat session owns it while this broker does not act as controller (its
        registration was lost, or it lost track of the seat): otherwise nobody could take the seat until the seat
        session ended. Returns whether a seat was freed."""
        session = self.session
        if self.held is not None:
            return False
        path = session.path(znodes.CONTROLLER)
        try:
            _, stat = await session.call(session.seat_kz().get_async(path), confirms=False)
        except NoNodeError:
            return False
        if stat.ephemeralOwner != session.seat_session_id or self.held is not None:
            return False
        try:
            await session.call(session.seat_kz().delete_async(path, version=stat.version), confirms=False)
        except (NoNodeError, BadVersionError):
            return False
        log.info("gave up the controller seat this broker no longer acts on")
        return True

    # ---- what a change of session means for the seat (the facade calls these) --------------------------------

    def forget(self) -> None:
        """A new session (main or seat) owns no seat: its /controller, if any, went with the old one."""
        self.held = None

    def main_session_lost(self) -> None:
        if not self.session.has_seat_session:
            log.warning("ZooKeeper session expired (LOST): registration and controller seat are gone")
            self.held = None
            return
        log.warning("ZooKeeper session expired (LOST): registration is gone%s",
                    "; giving up the controller seat" if self.held is not None else "")
        # A broker without a registration must not control; its seat session may live on, so the seat is freed
        # (the others see this broker dead, and elect at once).
        if self.held is not None:
            self.held = None
            self.session.spawn(self.release, "the controller seat")

    def seat_session_lost(self) -> None:
        if self.held is not None:
            log.warning("controller seat session expired (LOST): no longer controller (epoch %d)", self.held[0])
        self.held = None
