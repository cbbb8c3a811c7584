"""broker/request_quota.py: the loop time a request's coroutine holds, and throttle_time_ms set in an answer."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from oncelog.broker.request_quota import EXEMPT_APIS, timed, with_throttle_time
from oncelog.protocol.apis import ApiKey
from oncelog.protocol.messages import RESPONSES, encode_response


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_timed_counts_the_steps_not_the_waits():
    async def handler() -> str:
        _spin(0.02)
        await asyncio.sleep(0.15)  # waiting costs the broker nothing
        _spin(0.01)
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.05, fut.set_result, "answer")
        return await fut

    async def main() -> tuple[str, float, float]:
        started = time.perf_counter()
        result, held = await timed(handler())
        return result, held, time.perf_counter() - started

    result, held, wall = asyncio.run(main())
    assert result == "answer"
    assert 0.03 <= held < 0.07, held
    assert wall >= 0.2


def test_timed_passes_exceptions_and_cancellations_through():
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("bad request")

    async def slow(seen: list[str]) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> list[str]:
        with pytest.raises(ValueError, match="bad request"):
            await timed(failing())
        seen: list[str] = []
        task = asyncio.ensure_future(timed(slow(seen)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    assert asyncio.run(main()) == ["cancelled"]


def _metadata(version: int, throttle: int) -> bytes:
    return encode_response(ApiKey.METADATA, version, {"throttle_time_ms": throttle, "brokers": [], "cluster_id": "c",
                                                      "controller_id": 1, "topics": []})


def test_throttle_time_first_field_keeps_the_larger():
    body = _metadata(9, 0)
    patched = with_throttle_time(ApiKey.METADATA, 9, body, 250)
    assert RESPONSES[ApiKey.METADATA].decode(memoryview(bytes(patched)), version=9).throttle_time_ms == 250
    assert bytes(patched)[4:] == body[4:]
    larger = with_throttle_time(ApiKey.METADATA, 9, _metadata(9, 900), 250)
    assert struct.unpack_from(">i", larger)[0] == 900
    # a list of pieces (Fetch): the first piece is patched, the rest left as they are
    tail = memoryview(b"records")
    pieces = with_throttle_time(ApiKey.FETCH, 11, [b"\x00\x00\x00\x00rest", tail], 40)
    assert pieces[0] == struct.pack(">i", 40) + b"rest" and pieces[1] is tail


def test_throttle_time_elsewhere_and_absent():
    answer = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 5, "log_append_time_ms": -1, "log_start_offset": 0,
         "record_errors": [], "error_message": None}]}], "throttle_time_ms": 0}
    patched = with_throttle_time(ApiKey.PRODUCE, 8, encode_response(ApiKey.PRODUCE, 8, answer), 321)
    assert RESPONSES[ApiKey.PRODUCE].decode(memoryview(bytes(patched)), version=8).to_dict() == {
        **answer, "throttle_time_ms": 321}
    # Metadata v0 has no throttle_time_ms: the answer goes as it is (the connection is still muted)
    v0 = encode_response(ApiKey.METADATA, 0, {"brokers": [], "topics": []})
    assert with_throttle_time(ApiKey.METADATA, 0, v0, 100) == v0


def test_brokers_own_apis_are_exempt():
    assert {ApiKey.WRITE_TXN_MARKERS, ApiKey.CONTROLLED_SHUTDOWN, ApiKey.SASL_AUTHENTICATE} <= EXEMPT_APIS
    assert ApiKey.PRODUCE not in EXEMPT_APIS and ApiKey.METADATA not in EXEMPT_APIS


def test_an_answer_the_codec_cannot_take_back_goes_as_it_is():
    damaged = b"\x00\x01\x02"  # not a Produce v8 answer
    assert with_throttle_time(ApiKey.PRODUCE, 8, damaged, 100) == damaged
