"""Brokers' metadata rooms in one process, for tests against a real ZooKeeper.

A `Node` is what one broker runs of cluster metadata: a MetadataImage, a MetadataStore (its own ZooKeeper
sessions: the broker's and the controller seat's) registered under a node id, and a Controller. Several nodes in
one event loop stand for several brokers. Waits are bounded by the session timeout, never by sleeps tuned to a machine.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from oncelog.cluster.controller import Controller
from oncelog.cluster.metadata_image import MetadataImage
from oncelog.cluster.metadata_store import MetadataStore
from oncelog.config import BrokerConfig, load_broker_config

SESSION_TIMEOUT_MS = 6000                         # comfortably above a loaded two-core machine's pauses
START_TIMEOUT_S = 30.0


def wait_s(session_timeout_ms: int = SESSION_TIMEOUT_MS) -> float:
    """How long a test waits for the cluster to converge: a few session timeouts."""
    return 3 * session_timeout_ms / 1000 + 10


def run(coro: Coroutine[Any, Any, Any], timeout: float = float(os.environ.get("ONCELOG_TEST_BODY_TIMEOUT", 240))) -> Any:
    """Run one test's coroutine on a fresh event loop, bounded; on a timeout the stacks of every task still
    waiting are printed, so a hang names what it waited for."""
    async def bounded() -> Any:
        main = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({main}, timeout=timeout)
        if not done:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    print(f"--- still waiting: {task.get_name()}", file=sys.stderr)
                    task.print_stack(limit=8, file=sys.stderr)
            main.cancel()
            raise TimeoutError(f"test body did not finish in {timeout:.0f}s")
        return main.result()

    return asyncio.run(bounded())


async def until(condition: Callable[[], bool], what: str, timeout: float | None = None) -> None:
    """Wait until `condition()` holds, polling the loop; fail naming `what` after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (timeout if timeout is not None else wait_s())
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def broker_config(connect: str, *settings: str) -> BrokerConfig:
    # The crash probe off: these nodes register addresses nobody listens on, which the probe would take for dead
    # processes (tests/cluster/test_crash_probe.py tests it with broker processes). No leader balance: a check
    # follows every node's (re)registration and would move leaderships under a test (tests that want it turn it on).
    return load_broker_config(overrides=[f"oncelog.coordination.connect={connect}",
                                         "auto.leader.rebalance.enable=false",
                                         "leader.imbalance.check.interval.seconds=3600",
                                         "oncelog.controller.broker.probe.interval.ms=0", *settings])


class Node:
    """One broker's metadata: image, store (session + registration) and controller."""

    def __init__(self, connect: str, node_id: int, *settings: str,
                 session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.connect = connect
        self.node_id = node_id
        self.config = broker_config(connect, *settings)
        self.session_timeout_ms = session_timeout_ms
        self.image = MetadataImage()
        self.store: MetadataStore | None = None
        self.controller: Controller | None = None
        self.epoch: int | None = None

    async def start(self, controller: bool = True, instance_id: str | None = None) -> Node:
        self.store = MetadataStore(self.connect, self.session_timeout_ms, asyncio.get_running_loop(), self.image,
                                   controller_session_timeout_ms=self.config["oncelog.controller.session.timeout.ms"])
        await self.store.start(START_TIMEOUT_S)
        self.epoch = await self.store.register_broker(self.node_id, "127.0.0.1", 9000 + self.node_id,
                                                      instance_id=instance_id or f"node-{self.node_id}")
        if controller:
            self.controller = Controller(self.node_id, self.store, self.image, self.config)
            await self.controller.start()
        return self

    async def stop(self) -> None:
        """A broker that goes away: its controller resigns, its session ends (its registration goes at once)."""
        if self.controller is not None:
            await self.controller.stop()
            self.controller = None
        if self.store is not None:
            await self.store.close()

    @property
    def active(self) -> bool:
        return self.controller is not None and self.controller.is_active


async def start_nodes(connect: str, ids: list[int], *settings: str, **kwargs: Any) -> dict[int, Node]:
    nodes = {i: await Node(connect, i, *settings, **kwargs).start() for i in ids}
    await until(lambda: all(set(n.image.brokers) == set(ids) for n in nodes.values()), "every node sees every broker")
    await until(lambda: sum(n.active for n in nodes.values()) == 1, "one active controller")
    return nodes


def active(nodes: dict[int, Node]) -> Node:
    found = [n for n in nodes.values() if n.active]
    assert len(found) == 1, f"active controllers: {[n.node_id for n in found]}"
    return found[0]


async def stop_all(nodes: dict[int, Node]) -> None:
    for node in nodes.values():
        await node.stop()


def converged(nodes: Any, check: Callable[[MetadataImage], bool]) -> Callable[[], bool]:
    """A condition: `check` holds on the image of every running node."""
    every = list(nodes.values() if isinstance(nodes, dict) else nodes)
    return lambda: all(check(n.image) for n in every if n.store is not None and n.store.state == "CONNECTED")


async def with_nodes(connect: str, ids: list[int], body: Callable[[dict[int, Node]], Awaitable[Any]],
                     *settings: str, **kwargs: Any) -> Any:
    nodes = await start_nodes(connect, ids, *settings, **kwargs)
    try:
        return await body(nodes)
    finally:
        await stop_all(nodes)
