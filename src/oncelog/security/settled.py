"""The security stores' writes are plain calls on the single node (a small file written in place: answered before
the next request is read, at no cost) and coroutines in a cluster (ZooKeeper round trips, which must not block the
event loop). Their protocols say so (`T | Awaitable[T]`), and a handler takes either with `await settled(...)`."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def settled(value: T | Awaitable[T]) -> T:
    """`value`, awaited first when it is awaitable."""
    if inspect.isawaitable(value):
        return await value
    return value
