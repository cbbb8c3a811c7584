"""The controller's crash probe: a broker whose process is gone is declared dead before its session expires.

A broker's registration lives as long as its ZooKeeper session, which outlives a kill -9 by the whole session
timeout (9 s by default, as KRaft's broker.session.timeout.ms): until then its leaderships, its transaction
coordinator partitions and its place in every ISR stay with a process that no longer exists. A crashed process
leaves one unambiguous trace much earlier: the host's kernel refuses connections to the port it listened on.

So the active controller connects, every `oncelog.controller.broker.probe.interval.ms`, to each other registered
broker's address. Only a refused connection counts; a timeout or anything else proves nothing (a paused process's
kernel still accepts, a partitioned or dead host does not answer at all) and is left to the session. After
`REFUSALS_TO_EXPIRE` refusals in a row for the same incarnation (broker epoch), the controller deletes that
incarnation's registration, checked against its czxid and this controller's epoch (docs/cluster.md §5.2). From
there the death takes the path a session expiry takes: every broker's watch removes it, the controller moves its
leaderships and shrinks the ISRs.

Why this cannot hurt a live broker: a live broker's listener accepts (registration happens only after it is
bound, and a clean shutdown stops renewing before it closes it). Should it happen anyway (a listener closed by
hand, a port refused by a firewall), the broker sees its registration vanish while its session lives and
registers again: a new broker epoch, treated as a restart. Fencing never depended on the session: every write is
checked against leader and controller epochs.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from .metadata_image import MetadataImage

log = logging.getLogger(__name__)

REFUSALS_TO_EXPIRE = 2     # refused connections in a row, one probe interval apart, before a broker is declared dead

Expire = Callable[[int, int], Awaitable[bool]]    # (node id, broker epoch) -> whether the registration was removed


class CrashProbe:
    """Owned by the controller; `run` probes while `active()` and returns when cancelled."""

    def __init__(self, node_id: int, image: MetadataImage, interval_ms: int, expire: Expire,
                 active: Callable[[], bool]) -> None:
        self.node_id = node_id
        self.image = image
        self.interval_s = interval_ms / 1000
        self.expire = expire
        self.active = active
        self._refused: dict[int, tuple[int, int]] = {}   # node id -> (broker epoch, refusals in a row)

    async def run(self) -> None:
        if self.interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            if not self.active():
                self._refused.clear()
                continue
            try:
                await self.probe_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("crash probe round failed")

    async def probe_once(self) -> None:
        targets = {n: b for n, b in self.image.brokers.items() if n != self.node_id}
        for gone in set(self._refused) - set(targets):
            del self._refused[gone]
        if not targets:
            return
        results = await asyncio.gather(*(self._refuses(b.host, b.port) for b in targets.values()))
        for (node, info), refused in zip(targets.items(), results, strict=True):
            if not refused:
                self._refused.pop(node, None)
                continue
            epoch, count = self._refused.get(node, (info.epoch, 0))
            count = count + 1 if epoch == info.epoch else 1
            self._refused[node] = (info.epoch, count)
            if count < REFUSALS_TO_EXPIRE or not self.active():
                continue
            log.warning("broker %d (epoch %d) refused %d connections in a row at %s:%d: its process is gone; "
                        "removing its registration before its session expires", node, info.epoch, count,
                        info.host, info.port)
            if await self.expire(node, info.epoch):
                self._refused.pop(node, None)

    async def _refuses(self, host: str, port: int) -> bool:
        """Whether every address of host:port refuses a connection (nothing listens there). Any other outcome,
        a name that does not resolve included, is False."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(max(self.interval_s, 0.1)):
                addresses = {info[4][0] for info in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
                for address in addresses:
                    try:
                        _, writer = await asyncio.open_connection(address, port)
                    except ConnectionRefusedError:
                        continue
                    writer.close()
                    return False
        except (OSError, TimeoutError):
            return False
        return bool(addresses)
