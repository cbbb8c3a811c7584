"""Hypothesis strategies that damage valid inputs the way a fuzzer does, plus the run budget of the fuzzers.

Budget: `FUZZ_EXAMPLES` inputs per target (default small enough for `make test`), `FUZZ_SECONDS` for the
end-to-end run against a broker. `FUZZ_RANDOM=1` draws fresh inputs each run (`make fuzz`); otherwise the
inputs are derandomized, so `make test` fails only on a regression, never on a lucky draw.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
SECONDS = float(os.environ.get("FUZZ_SECONDS", "20"))
RANDOM = os.environ.get("FUZZ_RANDOM", "") not in ("", "0")

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=not RANDOM, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# Values that break length and count fields: empty, null (-1), sign flips, one past every width.
_INTERESTING = (0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000, 0xFFFFFFFF,
                0x7FFFFFFFFFFFFFFF)


@st.composite
def damaged(draw: st.DrawFn, seeds: Sequence[bytes], max_mutations: int = 4) -> bytes:
    """A seed with a few mutations: bit flips, interesting integers written over fields, cut, insert,
    duplicate or delete ranges, a cut-off end. Now and then plain random bytes instead."""
    if draw(st.integers(0, 15)) == 0:
        return draw(st.binary(max_size=256))
    data = bytearray(draw(st.sampled_from(list(seeds))))
    for _ in range(draw(st.integers(1, max_mutations))):
        size = len(data)
        pos = draw(st.integers(0, max(size - 1, 0)))
        op = draw(st.integers(0, 7))
        if op == 0 and size:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == 1 and size:
            data[pos] = draw(st.sampled_from((0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)))
        elif op == 2:
            width = draw(st.sampled_from((1, 2, 4, 8)))
            value = draw(st.sampled_from(_INTERESTING)) & ((1 << (8 * width)) - 1)
            data[pos:pos + width] = value.to_bytes(width, "big")
        elif op == 3:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == 4 and size:
            del data[pos:pos + draw(st.integers(1, 16))]
        elif op == 5 and size:
            end = draw(st.integers(pos, size))
            data[pos:pos] = data[pos:end]
        elif op == 6:
            del data[pos:]
        else:
            varint = draw(st.sampled_from((b"\x00", b"\x01", b"\x7f", b"\xff\xff\xff\xff\x0f", b"\xff" * 6)))
            data[pos:pos + 1] = varint
    return bytes(data)


def with_fixed_crc(fix: Callable[[bytearray], None]) -> Callable[[bytes], bytes]:
    """Mutations usually stop at a checksum; recomputing it afterwards lets them reach the parser behind."""
    def apply(data: bytes) -> bytes:
        buf = bytearray(data)
        try:
            fix(buf)
        except (struct.error, ValueError, IndexError):
            pass
        return bytes(buf)

    return apply


def record_iterations(target: str, count: int) -> None:
    """Add `count` inputs run against `target` to the report named by FUZZ_REPORT (JSON lines), if any."""
    path = os.environ.get("FUZZ_REPORT")
    if path:
        with Path(path).open("a") as f:
            f.write(json.dumps({"target": target, "inputs": count}) + "\n")
