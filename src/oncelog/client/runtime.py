"""The background event loop behind the synchronous facades, and a fork-safe per-process cache.

The client's core is asyncio; `Producer`, `Consumer` and `Admin` are used from plain
threads. Every client object in a process shares one daemon thread running one loop
(`get_runtime()`), so a thousand producers do not mean a thousand threads, and
callers from any thread hand coroutines to it with `run` / `submit`.

Spark's Python workers are forked from a daemon and then reused for many tasks. A
forked child inherits the parent's memory but not its threads: the parent's loop
thread, its locks and its connections are unusable there. So the runtime is keyed
by process id and rebuilt on first use after a fork, and `cached(key, factory)` —
how the Spark layer keeps one producer per configuration across the tasks a worker
runs — forgets everything the parent had cached.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, TypeVar

from .errors import KafkaError, KafkaTimeoutError

__all__ = ["LoopThread", "get_runtime", "cached", "cache_pop", "clear_cache"]

log = logging.getLogger("oncelog.client.runtime")

T = TypeVar("T")

_CLOSE_TIMEOUT = 30.0  # seconds a cached client may take to flush and close at exit


class LoopThread:
    """One daemon thread running one asyncio event loop until `stop()`."""

    def __init__(self, name: str = "oncelog-client") -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._on_loop_error)
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), name=name, daemon=True)
        self.thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    @staticmethod
    def _on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        log.error("oncelog client loop: %s", context.get("message"), exc_info=context.get("exception"))

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self.loop.is_closed() and self.pid == os.getpid()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop from any thread; a concurrent future of its result."""
        if not self.alive:
            coro.close()
            raise KafkaError("the client runtime is stopped")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result; from any thread except the loop's own.

        After `timeout` seconds the coroutine is cancelled and `KafkaTimeoutError` raised.
        """
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("LoopThread.run() called from the loop thread: await the coroutine instead")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise KafkaTimeoutError(f"operation did not complete within {timeout}s") from None
        except concurrent.futures.CancelledError:
            raise KafkaError("operation cancelled (the client runtime stopped)") from None

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run a plain callback on the loop thread, from any thread."""
        self.loop.call_soon_threadsafe(callback, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop (cancelling what still runs on it) and join the thread."""
        if not self.alive:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop_thread():
            self.thread.join(timeout)


_lock = threading.Lock()
_runtime: LoopThread | None = None
_cache: dict[Hashable, Any] = {}
_cache_pid = os.getpid()


def _after_fork_in_child() -> None:
    # The parent's loop thread does not exist here and its lock may have been held at fork time.
    global _lock, _runtime, _cache, _cache_pid
    _lock = threading.Lock()
    _runtime = None
    _cache = {}
    _cache_pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def get_runtime() -> LoopThread:
    """The process's loop thread, started on first use and again in a forked child."""
    global _runtime
    runtime = _runtime
    if runtime is not None and runtime.pid == os.getpid() and runtime.alive:
        return runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid() or not _runtime.alive:
            _runtime = LoopThread()
        return _runtime


def _check_cache_pid() -> None:
    # register_at_fork covers os.fork(); this covers forks it cannot see (e.g. a C extension calling fork()).
    global _cache, _cache_pid
    if _cache_pid != os.getpid():
        _cache = {}
        _cache_pid = os.getpid()


def cached(key: Hashable, factory: Callable[[], T]) -> T:
    """The object cached under `key` in this process, made with `factory()` on first use.

    For clients that should outlive one task of a reused worker process (a producer per
    configuration). The factory runs outside the lock but at most once per key: concurrent
    callers for the same key wait for the first one's result. After a fork the child starts
    with an empty cache.
    """
    with _lock:
        _check_cache_pid()
        entry = _cache.get(key)
        if entry is None:
            entry = _cache[key] = _Pending()
            owner = True
        else:
            owner = False
    if isinstance(entry, _Pending):
        if owner:
            try:
                value = factory()
            except BaseException as exc:
                with _lock:
                    if _cache.get(key) is entry:
                        del _cache[key]
                entry.fail(exc)
                raise
            with _lock:
                if _cache.get(key) is entry:
                    _cache[key] = value
            entry.set(value)
            return value
        return entry.wait()
    return entry


def cache_pop(key: Hashable) -> Any:
    """Remove and return the object cached under `key` (None if there is none); the caller closes it."""
    with _lock:
        _check_cache_pid()
        value = _cache.pop(key, None)
    return None if isinstance(value, _Pending) else value


def clear_cache(close: bool = True) -> None:
    """Forget every cached object, calling `close()` on those that have one when `close`."""
    with _lock:
        _check_cache_pid()
        values = [v for v in _cache.values() if not isinstance(v, _Pending)]
        _cache.clear()
    if close:
        for value in values:
            closer = getattr(value, "close", None)
            if callable(closer):
                try:
                    result = closer()
                    if inspect.iscoroutine(result):  # an async core's close(): run it on the loop
                        _run_close(result)
                except Exception:
                    log.exception("closing cached %r failed", value)


def _run_close(coro: Coroutine[Any, Any, Any]) -> None:
    runtime = _runtime
    if runtime is None or not runtime.alive or runtime.in_loop_thread():
        coro.close()
        return
    runtime.run(coro, timeout=_CLOSE_TIMEOUT)


class _Pending:
    """A cache slot whose object is still being made by another thread."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any) -> None:
        self._value = value
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def wait(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def _close_at_exit() -> None:
    # Cached producers flush and close at interpreter exit, while the loop thread still runs.
    if _cache_pid == os.getpid():
        clear_cache(close=True)


atexit.register(_close_at_exit)
