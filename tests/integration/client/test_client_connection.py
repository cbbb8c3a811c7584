"""BrokerConnection against a real broker: ApiVersions, the hand codecs end to end, pipelining, timeouts."""

from __future__ import annotations

import asyncio
import time

import pytest
from tests.integration.helpers import create_topic

from oncelog.client.connection import BrokerConnection
from oncelog.client.errors import NetworkError, RequestTimedOut, UnsupportedVersion
from oncelog.protocol import client_codecs as cc
from oncelog.protocol.apis import SPECS, ApiKey
from oncelog.records.builder import build_batch
from oncelog.records.reader import read_batches


def _run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _connect(broker, **kw) -> BrokerConnection:
    host, port = broker.bootstrap.rsplit(":", 1)
    conn = BrokerConnection(host, int(port), **kw)
    await conn.connect()
    return conn


def test_api_versions_negotiation(module_broker):
    async def scenario():
        conn = await _connect(module_broker)
        try:
            # the broker's advertised table is exactly its SPECS (every API it registered)
            for key, spec in SPECS.items():
                if key in conn.api_versions:
                    assert conn.api_versions[key] == (spec.min_version, spec.max_version)
            assert conn.api_versions[ApiKey.PRODUCE] == (3, 11) and conn.api_versions[ApiKey.FETCH] == (4, 12)
            assert conn.api_version(ApiKey.PRODUCE, 13) == 11  # ours above theirs: theirs
            assert conn.api_version(ApiKey.METADATA, 7) == 7  # theirs above ours: ours
            with pytest.raises(UnsupportedVersion):
                conn.api_version(ApiKey.PRODUCE, 20, 12)
            with pytest.raises(UnsupportedVersion):
                conn.api_version(9999, 1)
        finally:
            await conn.close()
        assert conn.closed
        with pytest.raises(NetworkError):
            await conn.call(ApiKey.METADATA, {"topics": []})
    _run(scenario())


def test_connect_refused_is_a_network_error():
    async def scenario():
        conn = BrokerConnection("127.0.0.1", 1, connect_timeout_ms=2000)
        with pytest.raises(NetworkError, match="cannot connect"):
            await conn.connect()
        assert conn.closed
    _run(scenario())


def test_produce_and_fetch_through_the_hand_codecs(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name, partitions=2)
    batches = [build_batch([(b"k%d" % i, b"v%d" % i) for i in range(n)]) for n in (3, 5)]

    async def scenario():
        conn = await _connect(module_broker)
        try:
            pv = conn.api_version(ApiKey.PRODUCE, *reversed(cc.PRODUCE_VERSIONS))
            body = cc.encode_produce_request(pv, None, -1, 10000,
                                             [(topic_name, [(0, memoryview(batches[0])), (1, batches[1])])])
            response = cc.decode_produce_response(pv, await conn.request(ApiKey.PRODUCE, pv, body))
            [(name, parts)] = response
            assert name == topic_name
            assert sorted((p.partition, p.error_code, p.base_offset, p.log_start_offset) for p in parts) == [
                (0, 0, 0, 0), (1, 0, 0, 0)]
            fv = conn.api_version(ApiKey.FETCH, *reversed(cc.FETCH_VERSIONS))
            fetch = cc.encode_fetch_request(fv, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=1,
                                            topics=[(topic_name, [(0, 0, 1 << 20), (1, 2, 1 << 20)])])
            result = cc.decode_fetch_response(fv, await conn.request(ApiKey.FETCH, fv, fetch))
            assert result.error_code == 0
            [(name, parts)] = result.topics
            by_partition = {p.partition: p for p in parts}
            p0, p1 = by_partition[0], by_partition[1]
            assert (p0.error_code, p0.high_watermark, p0.last_stable_offset) == (0, 3, 3)
            assert [(r.key, r.value) for b in read_batches(p0.records) for r in b.records] == [
                (b"k0", b"v0"), (b"k1", b"v1"), (b"k2", b"v2")]
            # fetching from offset 2 of a 5-record batch returns the whole batch (Kafka's rule)
            assert [r.value for b in read_batches(p1.records) for r in b.records] == [b"v%d" % i for i in range(5)]
            assert p1.high_watermark == 5 and p1.aborted_transactions in (None, [])
        finally:
            await conn.close()
    _run(scenario())


def test_pipelining_100_requests_answered_in_order(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name)

    async def scenario():
        conn = await _connect(module_broker)
        try:
            pv = conn.api_version(ApiKey.PRODUCE, 11, 3)
            bodies = [cc.encode_produce_request(pv, None, -1, 10000, [(topic_name, [(0, build_batch([(None, b"%d" % i)]))])])
                      for i in range(100)]
            # all written before the first answer arrives: 100 in flight on one connection
            futures = [asyncio.ensure_future(conn.request(ApiKey.PRODUCE, pv, b)) for b in bodies]
            await asyncio.sleep(0)
            assert conn.in_flight == 100
            answers = await asyncio.gather(*futures)
            offsets = [cc.decode_produce_response(pv, a)[0].partitions[0].base_offset for a in answers]
            # Produce on one partition is applied in request order: offsets follow the send order
            assert offsets == list(range(100))
            assert conn.in_flight == 0
        finally:
            await conn.close()
    _run(scenario())


def test_timeout_closes_the_connection_and_fails_everything_in_flight(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name)

    async def scenario():
        conn = await _connect(module_broker)
        fv = conn.api_version(ApiKey.FETCH, 12, 4)
        # a long poll on an empty partition: the broker holds it for 10 s, our deadline is 0.5 s
        body = cc.encode_fetch_request(fv, max_wait_ms=10000, min_bytes=1 << 20, max_bytes=1 << 20,
                                       isolation_level=0, topics=[(topic_name, [(0, 0, 1 << 20)])])
        started = time.monotonic()
        slow = asyncio.ensure_future(conn.request(ApiKey.FETCH, fv, body, timeout=0.5))
        behind = [asyncio.ensure_future(conn.call(ApiKey.METADATA, {"topics": []}, timeout=30)) for _ in range(5)]
        results = await asyncio.gather(slow, *behind, return_exceptions=True)
        elapsed = time.monotonic() - started
        assert isinstance(results[0], RequestTimedOut), results[0]
        # answers queued behind the lost one are failed too, without waiting for their own deadlines
        for r in results[1:]:
            assert isinstance(r, NetworkError) and not isinstance(r, RequestTimedOut), r
        assert 0.4 < elapsed < 5, elapsed
        assert conn.closed and conn.in_flight == 0
        with pytest.raises(NetworkError):
            await conn.call(ApiKey.METADATA, {"topics": []})
    _run(scenario())


def test_broker_killed_fails_in_flight_requests(broker_factory, topic_name):
    broker = broker_factory()
    create_topic(broker.bootstrap, topic_name)

    async def scenario():
        conn = await _connect(broker)
        fv = conn.api_version(ApiKey.FETCH, 12, 4)
        body = cc.encode_fetch_request(fv, max_wait_ms=20000, min_bytes=1 << 20, max_bytes=1 << 20,
                                       isolation_level=0, topics=[(topic_name, [(0, 0, 1 << 20)])])
        waiting = asyncio.ensure_future(conn.request(ApiKey.FETCH, fv, body, timeout=30))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, broker.kill)
        with pytest.raises(NetworkError) as info:
            await waiting
        assert not isinstance(info.value, RequestTimedOut)
        assert time.monotonic() - started < 5
        assert conn.closed
    _run(scenario())


def test_large_fetch_response_is_read_into_one_buffer(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name)
    value = bytes(range(256)) * 3000  # 750 KiB record: a frame far larger than the receive buffer

    async def scenario():
        conn = await _connect(module_broker)
        try:
            pv = conn.api_version(ApiKey.PRODUCE, 11, 3)
            body = cc.encode_produce_request(pv, None, -1, 10000, [(topic_name, [(0, build_batch([(None, value)]))])])
            [(_, [part])] = cc.decode_produce_response(pv, await conn.request(ApiKey.PRODUCE, pv, body))
            assert part.error_code == 0
            fv = conn.api_version(ApiKey.FETCH, 12, 4)
            fetch = cc.encode_fetch_request(fv, max_wait_ms=0, min_bytes=0, max_bytes=4 << 20, isolation_level=0,
                                            topics=[(topic_name, [(0, 0, 4 << 20)])])
            frame = await conn.request(ApiKey.FETCH, fv, fetch)
            result = cc.decode_fetch_response(fv, frame)
            records = result.topics[0][1][0].records
            assert records.obj is frame.obj  # the records are a view of the one frame buffer
            [batch] = read_batches(records)
            assert batch.records[0].value == value
        finally:
            await conn.close()
    _run(scenario())


def test_acks_zero_requests_expect_no_response(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name)

    async def scenario():
        conn = await _connect(module_broker)
        try:
            pv = conn.api_version(ApiKey.PRODUCE, 11, 3)
            for i in range(10):
                body = cc.encode_produce_request(pv, None, 0, 10000, [(topic_name, [(0, build_batch([(None, b"%d" % i)]))])])
                assert await conn.request(ApiKey.PRODUCE, pv, body, expect_response=False) is None
            assert conn.in_flight == 0
            # the next answered request lines up: no response was owed for the acks=0 ones
            fv = conn.api_version(ApiKey.FETCH, 12, 4)
            fetch = cc.encode_fetch_request(fv, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                                            topics=[(topic_name, [(0, 0, 1 << 20)])])
            deadline = asyncio.get_running_loop().time() + 15
            while True:  # acks=0 appends are not awaited by anyone: poll until they are visible
                result = cc.decode_fetch_response(fv, await conn.request(ApiKey.FETCH, fv, fetch))
                values = [r.value for b in read_batches(result.topics[0][1][0].records) for r in b.records]
                if len(values) >= 10 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert values == [b"%d" % i for i in range(10)]
        finally:
            await conn.close()
    _run(scenario())


def test_read_committed_fetch_reports_aborted_transactions(module_broker, topic_name):
    """A transaction driven over the long-tail codecs and the hand Produce codec, aborted, then read back:
    the Fetch decoder returns the aborted transaction's (producer id, first offset) and the LSO."""
    from oncelog.client.cluster import TRANSACTION, Cluster
    from oncelog.client.config import ClientConfig

    create_topic(module_broker.bootstrap, topic_name)
    txn = f"txn-{topic_name}"

    async def scenario():
        cluster = Cluster(ClientConfig({"bootstrap.servers": module_broker.bootstrap}, "producer"))
        try:
            await cluster.bootstrap()
            init = await cluster.coordinator_call(txn, TRANSACTION, ApiKey.INIT_PRODUCER_ID, {
                "transactional_id": txn, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1})
            assert init.error_code == 0
            pid, epoch = init.producer_id, init.producer_epoch
            add = await cluster.coordinator_call(txn, TRANSACTION, ApiKey.ADD_PARTITIONS_TO_TXN, {
                "v3_and_below_transactional_id": txn, "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": [{"name": topic_name, "partitions": [0]}]}, version=3,
                error_of=lambda r: r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)
            assert add.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
            conn = await cluster.leader_connection(topic_name, 0)
            pv = conn.api_version(ApiKey.PRODUCE, 11, 3)
            batch = build_batch([(None, b"a"), (None, b"b")], transactional=True, producer_id=pid,
                                producer_epoch=epoch, base_sequence=0)
            body = cc.encode_produce_request(pv, txn, -1, 10000, [(topic_name, [(0, batch)])])
            [(_, [part])] = cc.decode_produce_response(pv, await conn.request(ApiKey.PRODUCE, pv, body))
            assert (part.error_code, part.base_offset) == (0, 0)
            end = await cluster.coordinator_call(txn, TRANSACTION, ApiKey.END_TXN, {
                "transactional_id": txn, "producer_id": pid, "producer_epoch": epoch, "committed": False})
            assert end.error_code == 0
            fv = conn.api_version(ApiKey.FETCH, 12, 4)
            fetch = cc.encode_fetch_request(fv, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=1,
                                            topics=[(topic_name, [(0, 0, 1 << 20)])])
            deadline = asyncio.get_running_loop().time() + 15
            while True:
                p = cc.decode_fetch_response(fv, await conn.request(ApiKey.FETCH, fv, fetch)).topics[0][1][0]
                if p.last_stable_offset == 3 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert (p.error_code, p.high_watermark, p.last_stable_offset) == (0, 3, 3)  # 2 records + marker
            assert [tuple(a) for a in p.aborted_transactions] == [(pid, 0)]
            batches = read_batches(p.records)
            assert [b.marker is not None for b in batches] == [False, True]
        finally:
            await cluster.close()
    _run(scenario())
