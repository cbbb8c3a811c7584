"""request_percentage (KIP-124): the share of the broker's request time a user or client id may take.

Kafka meters the time a request spends on a request handler thread (and on the network thread) and bounds a
client's share: a quota of 50 is half of one thread's time, over the quota window. oncelog serves every request on
one event loop, where a request's own time is the time its coroutine holds the loop: the sum of its steps from one
`await` to the next, not the time it waits (for a flush, a replica, a delayed fetch), which costs the broker
nothing. `timed` measures exactly that by stepping the handler's coroutine itself. A quota of 100 is then the whole
loop, the broker's whole capacity for requests.

As Kafka's ClientRequestQuotaManager: the time is recorded as percent (seconds x 100) into the Rate of the
connection's (user, client id) quota, a violation's throttle time is bounded by one quota window, the answer
carries it in `throttle_time_ms` (the larger of it and a byte-rate throttle already there) and the connection is
muted for it (KIP-219). Not throttled (Kafka's sendResponseExemptThrottle): the brokers' own APIs (a follower's
Fetch, WriteTxnMarkers, ControlledShutdown, FetchSnapshot), the SASL exchange, and an admin request another broker
forwarded (it is recorded against its client, whose own broker throttles it).

The metering is off, at the cost of one test per request, while no request_percentage quota is set.
"""

from __future__ import annotations

import logging
import struct
import time
import types
from collections.abc import Coroutine, Generator
from functools import cache
from typing import Any

from ..protocol.apis import ApiKey
from ..protocol.messages import RESPONSES, encode_response

# Kafka's exempt APIs: cluster actions (and the SASL exchange, which Kafka serves before its request threads).
EXEMPT_APIS = frozenset({ApiKey.WRITE_TXN_MARKERS, ApiKey.CONTROLLED_SHUTDOWN, ApiKey.FETCH_SNAPSHOT,
                         ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})

_INT32 = struct.Struct(">i")
log = logging.getLogger("oncelog.quotas")


@types.coroutine
def timed(coro: Coroutine[Any, Any, Any]) -> Generator[Any, Any, tuple[Any, float]]:
    """Await `coro`, returning (its result, the seconds its steps held the event loop). Each step is one
    `send` into the coroutine, run by the task that awaits this; what it yields (a future it waits on) is passed up
    to the task and the task's answer passed down, so the coroutine behaves exactly as if awaited directly."""
    held = 0.0
    clock = time.perf_counter
    value: Any = None
    error: BaseException | None = None
    while True:
        start = clock()
        try:
            yielded = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as done:
            held += clock() - start
            return done.value, held
        held += clock() - start
        value, error = None, None
        try:
            value = yield yielded
        except BaseException as exc:  # a cancellation (or close) goes to the coroutine, as with a plain await
            error = exc


@cache
def _throttle_field(api_key: int, version: int) -> str:
    """Where a response of this version carries throttle_time_ms: "first" (the body's first field, most APIs),
    "inside" (elsewhere: Produce, ApiVersions) or "none" (no such field at this version)."""
    cls = RESPONSES.get(api_key)
    if cls is None:
        return "none"
    present = [name for name, field in cls._struct.fields.items()
               if field.for_version_q(version) and not field.tagged_field_q(version)]
    if "throttle_time_ms" not in present:
        return "none"
    return "first" if present[0] == "throttle_time_ms" else "inside"


def with_throttle_time(api_key: int, version: int, result: Any, throttle_ms: int) -> Any:
    """The encoded answer `result` (bytes, or a list of pieces whose first is bytes) with its throttle_time_ms
    raised to `throttle_ms` (Kafka's maybeSetThrottleTimeMs, keeping a larger one already there)."""
    where = _throttle_field(api_key, version)
    if where == "first":
        if isinstance(result, list):
            head = result[0] if result else None
            if not isinstance(head, (bytes, bytearray, memoryview)) or len(head) < 4:
                return result
            patched = bytearray(head)
            patched[:4] = _INT32.pack(max(throttle_ms, _INT32.unpack_from(patched)[0]))
            return [bytes(patched), *result[1:]]
        patched = bytearray(result)
        patched[:4] = _INT32.pack(max(throttle_ms, _INT32.unpack_from(patched)[0]))
        return patched
    if where == "inside" and not isinstance(result, list):
        # rare (a throttled Produce or ApiVersions answer): decode, set, encode again. Should the codec not take
        # an answer back, it goes as it is: the mute still throttles, only the figure is missing
        try:
            fields = RESPONSES[api_key].decode(memoryview(bytes(result)), version=version).to_dict()
            fields["throttle_time_ms"] = max(throttle_ms, fields.get("throttle_time_ms") or 0)
            return encode_response(api_key, version, fields)
        except Exception:
            log.warning("could not set throttle_time_ms in a %s v%d answer; sent without it", ApiKey(api_key).name,
                        version, exc_info=True)
            return result
    return result
