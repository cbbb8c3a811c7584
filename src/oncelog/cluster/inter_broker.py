"""Requests from this broker to the others: admin requests forwarded to the controller, controlled shutdown,
and single requests to a named broker (transaction markers, transaction verification).

Admin requests that change metadata (CreateTopics, DeleteTopics, CreatePartitions, IncrementalAlterConfigs,
AlterPartitionReassignments, ElectLeaders) are carried out by the controller (docs/cluster.md §5.2). A broker that
receives one and is not the controller sends the same request, byte for byte, to the broker the metadata image
names as controller, over an oncelog client connection, with a client id that marks it as forwarded and names the
client it is forwarded for (security/forwarding.py: with ACLs on, the controller decides it as that client's):
the receiver executes it if it is the controller and answers NOT_CONTROLLER otherwise, never forwarding it again,
so two brokers with views a watch apart cannot bounce a request between them. While there is no controller, or
the one named answers NOT_CONTROLLER or cannot be reached, the request waits for the image to name another (or for
a short backoff) and goes again, until its deadline.

ControlledShutdown (API 7, v3) goes the same way with this broker's id and broker epoch.

Connections are opened on first use and kept per broker; a broker that moved (a new address in the image) gets a
new connection. No kazoo here: where the controller is comes from the image.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..client.connection import BrokerConnection
from ..client.errors import KafkaError as ClientError
from ..errors import ErrorCode
from ..protocol import client_codecs as codecs
from ..protocol.apis import ApiKey
from ..security.forwarding import FORWARDED_CLIENT_ID_PREFIX, forwarded_client_id
from ..security.forwarding import is_forwarded as is_forwarded
from .metadata_image import NO_CONTROLLER

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from .metadata_image import ImageDelta, MetadataImage

log = logging.getLogger(__name__)

CONTROLLED_SHUTDOWN_VERSION = 3
RETRY_BACKOFF_S = 0.2  # between attempts when the controller answered NOT_CONTROLLER and the image named no other


def error_codes(value: Any) -> Iterator[int]:
    """Every `error_code` in a decoded response, nested structures included."""
    if isinstance(value, list):
        for item in value:
            yield from error_codes(item)
        return
    fields = getattr(value, "_struct", None)
    if fields is None:
        return
    for name in fields.fields:
        item = getattr(value, name, None)
        if name == "error_code" and isinstance(item, int):
            yield item
        elif isinstance(item, list) or hasattr(item, "_struct"):
            yield from error_codes(item)


class ControllerUnavailable(Exception):
    """No controller answered the request before its deadline."""


class ControllerIsHere(Exception):
    """The image names this broker as the controller: the caller runs the request itself."""


class InterBroker:
    """This broker's connections to the other brokers of the cluster."""

    def __init__(self, node_id: int, image: MetadataImage, config: BrokerConfig, security: Any = None) -> None:
        self.node_id = node_id
        self.security = security  # client.security.Security of the inter-broker listener (None: PLAINTEXT)
        self.image = image
        self.client_id = f"{FORWARDED_CLIENT_ID_PREFIX}{node_id}"
        self._timeout_ms: int = config["replica.socket.timeout.ms"]
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Lock] = {}
        self._controller_changed = asyncio.Event()
        self._closed = False
        image.subscribe(self._on_delta)

    def _on_delta(self, delta: ImageDelta) -> None:
        if delta.controller_changed or delta.brokers_changed:
            self._controller_changed.set()

    async def close(self) -> None:
        self._closed = True
        self.image.unsubscribe(self._on_delta)
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

    # -- connections -------------------------------------------------------------------------------------------
    async def connection(self, node_id: int, timeout_s: float) -> BrokerConnection:
        """The open connection to `node_id` at the address the image gives, opened if needed."""
        info = self.image.brokers.get(node_id)
        if info is None:
            raise ClientError(f"broker {node_id} is not registered")
        lock = self._connecting.setdefault(node_id, asyncio.Lock())
        async with lock:
            conn = self._connections.get(node_id)
            if conn is not None and not conn.closed and (conn.host, conn.port) == (info.host, info.port):
                return conn
            if conn is not None:
                await conn.close()
            timeout_ms = max(1, min(self._timeout_ms, int(timeout_s * 1000)))
            conn = BrokerConnection(info.host, info.port, node_id, client_id=self.client_id,
                                    request_timeout_ms=self._timeout_ms, connect_timeout_ms=timeout_ms,
                                    security=self.security)
            await conn.connect()
            self._connections[node_id] = conn
            return conn

    async def request(self, node_id: int, api_key: int, version: int, data: dict[str, Any], timeout_s: float) -> Any:
        """One request to broker `node_id` (this one included: a transaction coordinator's marker for a partition
        it has just come to lead goes the same way); the decoded response. A failed or timed-out exchange closes
        the connection, so the next call opens a fresh one. Raises the client's KafkaError or OSError."""
        payload = codecs.encode_request(api_key, version, data)
        conn = await self.connection(node_id, timeout_s)
        try:
            frame = await conn.request(api_key, version, payload, timeout=max(timeout_s, 0.001))
        except (ClientError, OSError):
            await conn.close()
            raise
        assert frame is not None
        return codecs.decode_response(api_key, version, bytes(frame))

    # -- the controller ----------------------------------------------------------------------------------------
    async def wait_for_controller_change(self, seconds: float) -> None:
        """Return when the image names another controller (or the brokers change), or after `seconds`."""
        await self._wait_for_controller_change(seconds)

    async def _wait_for_controller_change(self, seconds: float) -> None:
        self._controller_changed.clear()
        try:
            async with asyncio.timeout(max(seconds, 0.0)):  # not wait_for: on 3.11 it can swallow a cancellation
                await self._controller_changed.wait()
        except TimeoutError:
            pass

    async def to_controller(self, api_key: int, version: int, body: bytes | memoryview, deadline: float,
                            on_behalf: tuple[str, str] | None = None) -> tuple[bytes, Any]:
        """Send a request to the controller and return (response body, decoded response), retrying with the next
        controller until one executes it. `on_behalf`: the (principal, host) of the client it is forwarded for.
        Raises ControllerUnavailable at `deadline` (loop time), and ControllerIsHere when the image names this
        broker."""
        loop = asyncio.get_running_loop()
        payload = bytes(body)
        client_id = forwarded_client_id(self.node_id, on_behalf)
        last: str = "no controller elected"
        while not self._closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            controller = self.image.controller_id
            if controller == NO_CONTROLLER or controller not in self.image.brokers:
                last = "no controller elected"
                await self._wait_for_controller_change(remaining)
                continue
            if controller == self.node_id:
                raise ControllerIsHere()
            try:
                frame = await self._exchange(controller, api_key, version, payload, remaining, client_id)
                assert frame is not None
                response_body = bytes(frame)
                decoded = codecs.decode_response(api_key, version, response_body)
            except (ClientError, OSError) as exc:
                last = f"controller {controller} unreachable: {exc}"
                log.info("forwarding %s to controller %d failed (%s); retrying", ApiKey(api_key).name,
                         controller, exc)
                if self.image.controller_id == controller:        # else the next one is named already: go now
                    await self._wait_for_controller_change(min(RETRY_BACKOFF_S, deadline - loop.time()))
                continue
            if ErrorCode.NOT_CONTROLLER in set(error_codes(decoded)):
                last = f"broker {controller} is no longer the controller"
                if self.image.controller_id == controller:
                    await self._wait_for_controller_change(min(RETRY_BACKOFF_S, deadline - loop.time()))
                continue
            return response_body, decoded
        raise ControllerUnavailable(last)

    async def _exchange(self, controller: int, api_key: int, version: int, payload: bytes,
                        timeout_s: float, client_id: str | None = None) -> memoryview | None:
        """Connect to `controller` if needed, send the request and return the response; given up as soon as the
        image names another controller or none. A paused controller that lost its seat would otherwise hold the
        request to its deadline (its kernel accepts the connection; nothing answers, not even ApiVersions) while
        a new one could answer it now. Should the paused one wake and carry it out after all, its writes fail on
        the controller-epoch check (docs/cluster.md §3)."""
        loop = asyncio.get_running_loop()
        moved = loop.create_future()
        opened: list[BrokerConnection] = []

        def on_delta(delta: ImageDelta) -> None:
            if delta.controller_changed and self.image.controller_id != controller and not moved.done():
                moved.set_result(None)

        async def exchange() -> memoryview | None:
            conn = await self.connection(controller, timeout_s)
            opened.append(conn)
            if self.image.controller_id != controller:            # replaced while the connection was opened
                raise ClientError(f"controller {controller} was replaced before the request went")
            return await conn.request(api_key, version, payload, timeout=max(timeout_s, 0.001), client_id=client_id)

        self.image.subscribe(on_delta)
        task = asyncio.ensure_future(exchange())
        try:
            await asyncio.wait({task, moved}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self.image.unsubscribe(on_delta)
        if not task.done():
            task.cancel()                        # a connect (its ApiVersions) still waiting: abandoned
            for conn in opened:
                await conn.close()               # the request in flight fails with its link (others on it retry)
            await asyncio.gather(task, return_exceptions=True)
            raise ClientError(f"controller {controller} lost its seat while the request waited")
        return task.result()

    async def controlled_shutdown(self, broker_epoch: int, deadline: float) -> tuple[ErrorCode, list[tuple[str, int]]]:
        """Ask the controller to move this broker's leaderships away; (error, partitions still led here)."""
        body = codecs.encode_request(ApiKey.CONTROLLED_SHUTDOWN, CONTROLLED_SHUTDOWN_VERSION,
                                     {"broker_id": self.node_id, "broker_epoch": broker_epoch})
        _, response = await self.to_controller(ApiKey.CONTROLLED_SHUTDOWN, CONTROLLED_SHUTDOWN_VERSION, body,
                                               deadline)
        remaining = [(p.topic_name, p.partition_index) for p in response.remaining_partitions]
        return ErrorCode(response.error_code), remaining
