"""The loop thread behind the sync facades: many caller threads, timeouts, and life after os.fork()."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest
from tests.integration.helpers import create_topic

from oncelog.client import runtime
from oncelog.client.cluster import Cluster
from oncelog.client.config import ClientConfig
from oncelog.client.errors import KafkaError, KafkaTimeoutError
from oncelog.protocol.apis import ApiKey


def _cluster_factory(bootstrap: str):
    def make() -> Cluster:
        cluster = Cluster(ClientConfig({"bootstrap.servers": bootstrap}, "producer"))
        runtime.get_runtime().run(cluster.bootstrap(), timeout=30)
        return cluster
    return make


def test_one_loop_serves_many_threads(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name, partitions=4)
    rt = runtime.get_runtime()
    assert rt is runtime.get_runtime() and rt.thread.daemon and rt.alive
    cluster = runtime.cached(("test-threads", module_broker.bootstrap), _cluster_factory(module_broker.bootstrap))
    errors: list[BaseException] = []
    results: list[int] = []

    async def work(i: int) -> int:
        await cluster.refresh_metadata([topic_name])
        conn = await cluster.leader_connection(topic_name, i % 4)
        response = await conn.call(ApiKey.METADATA, {"topics": [{"name": topic_name}]})
        return len(response.topics[0].partitions)

    def caller(i: int) -> None:
        try:
            for _ in range(20):
                results.append(rt.run(work(i), timeout=30))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert results == [4] * 320
    # every thread used the same cluster, so the same single connection
    assert cluster.connected_nodes() == [0] and cluster.stats["connects"] == 1
    # the cache hands the same object back, across threads too
    assert runtime.cached(("test-threads", module_broker.bootstrap), lambda: None) is cluster
    rt.run(cluster.close(), timeout=10)
    assert runtime.cache_pop(("test-threads", module_broker.bootstrap)) is cluster


def test_run_timeout_cancels_the_coroutine():
    rt = runtime.get_runtime()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(KafkaTimeoutError):
        rt.run(forever(), timeout=0.2)
    assert cancelled.wait(5)

    async def nested() -> None:
        rt.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="loop thread"):
        rt.run(nested(), timeout=5)


def test_cached_factory_runs_once_under_concurrency():
    calls = []
    barrier = threading.Barrier(8)

    def factory():
        calls.append(1)
        return object()

    got = []

    def worker():
        barrier.wait()
        got.append(runtime.cached("test-once", factory))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and len({id(g) for g in got}) == 1
    runtime.cache_pop("test-once")

    def failing():
        raise ValueError("no")

    with pytest.raises(ValueError):
        runtime.cached("test-fail", failing)
    assert runtime.cached("test-fail", lambda: 5) == 5  # a failed factory leaves no entry behind
    runtime.cache_pop("test-fail")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_works_after_fork_and_worker_reuse(module_broker, topic_name):
    """A Spark-like worker: forked from a parent whose runtime and cache are busy, then running several
    tasks that share one cached client; the parent keeps working too."""
    create_topic(module_broker.bootstrap, topic_name, partitions=2)
    key = ("test-fork", module_broker.bootstrap)
    parent_rt = runtime.get_runtime()
    parent_cluster = runtime.cached(key, _cluster_factory(module_broker.bootstrap))
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running pytest's teardown
        code = 1
        try:
            report: dict = {"stale_cache": runtime.cached(key, lambda: None) is not None}
            runtime.cache_pop(key)
            rt = runtime.get_runtime()
            report["new_runtime"] = rt is not parent_rt and rt.pid == os.getpid() and rt.alive
            tasks = []
            for _ in range(3):  # three "tasks" reusing the worker's cached client
                cluster = runtime.cached(key, _cluster_factory(module_broker.bootstrap))

                async def task(c=cluster):
                    await c.refresh_metadata([topic_name])
                    return c.partitions_for(topic_name)

                tasks.append((id(cluster), rt.run(task(), timeout=30)))
            report["one_client"] = len({t[0] for t in tasks}) == 1
            report["partitions"] = [t[1] for t in tasks]
            with os.fdopen(write_fd, "w") as out:
                json.dump(report, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, data
    report = json.loads(data)
    assert report == {"stale_cache": False, "new_runtime": True, "one_client": True,
                      "partitions": [[0, 1]] * 3}
    # the parent's runtime and client were not disturbed by the child
    assert runtime.get_runtime() is parent_rt

    async def parent_task():
        await parent_cluster.refresh_metadata([topic_name], force=True)
        return parent_cluster.partitions_for(topic_name)

    assert parent_rt.run(parent_task(), timeout=30) == [0, 1]
    parent_rt.run(parent_cluster.close(), timeout=10)
    runtime.cache_pop(key)


def test_clear_cache_closes_sync_and_async_clients(module_broker):
    closed = []

    class SyncClient:
        def close(self):
            closed.append("sync")

    runtime.cached("test-close-sync", SyncClient)
    cluster = runtime.cached("test-close-async", _cluster_factory(module_broker.bootstrap))
    runtime.clear_cache(close=True)
    assert closed == ["sync"] and cluster.closed and cluster.connected_nodes() == []
    assert runtime.cached("test-close-sync", lambda: 1) == 1  # the cache is empty again
    runtime.clear_cache(close=False)


def test_a_stopped_loop_thread_is_replaced():
    private = runtime.LoopThread(name="oncelog-test")
    assert private.run(asyncio.sleep(0, result=7), timeout=5) == 7
    private.stop()
    assert not private.alive and not private.thread.is_alive()
    with pytest.raises(KafkaError, match="stopped"):
        private.submit(asyncio.sleep(0))
    shared = runtime.get_runtime()
    assert shared is not private and shared.alive
