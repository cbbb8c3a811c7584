from __future__ import annotations

import gzip
import os
import struct
import tracemalloc

import cramjam
import pytest
from aiokafka.codec import snappy_encode as aiokafka_snappy_encode

from oncelog.records.compression import (
    LZ4_FLG_BLOCK_INDEPENDENT,
    XERIAL_MAGIC,
    CompressionError,
    UnsupportedCodecError,
    compress,
    decompress,
    is_xerial,
    lz4_blocks_independent,
    snappy_decompress,
    xerial_compress,
)

CODECS = [1, 2, 3, 4]
# Compressible but not trivial: JSON-ish lines with counters.
DATA = b"".join(b'{"id": %d, "name": "user-%d", "payload": "%s"}\n' % (i, i % 97, b"x" * (i % 50))
                for i in range(5000))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview-slice"])
def test_round_trip_every_input_type(codec, kind):
    if kind == "bytes":
        data = DATA
    elif kind == "bytearray":
        data = bytearray(DATA)
    else:
        data = memoryview(b"junk" + DATA + b"junk")[4:-4]
    packed = compress(codec, data)
    assert len(packed) < len(DATA)
    assert bytes(decompress(codec, memoryview(b"zz" + packed)[2:])) == DATA


@pytest.mark.parametrize("codec", CODECS)
def test_empty_input(codec):
    assert bytes(decompress(codec, compress(codec, b""))) == b""


def test_codec_none_is_identity():
    assert bytes(decompress(0, memoryview(b"abc"))) == b"abc"
    assert compress(0, bytearray(b"abc")) == b"abc"


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(codec):
    with pytest.raises(UnsupportedCodecError):
        decompress(codec, b"abc")
    with pytest.raises(UnsupportedCodecError):
        compress(codec, b"abc")


@pytest.mark.parametrize("codec", CODECS)
def test_garbage_raises_compression_error(codec):
    with pytest.raises(CompressionError):
        decompress(codec, b"\xff" * 12 + b"not compressed at all" * 4)


# --- snappy -----------------------------------------------------------------------------------------

def test_snappy_compress_writes_xerial_framing():
    packed = compress(2, DATA)
    assert packed[:8] == XERIAL_MAGIC
    assert struct.unpack(">ii", packed[8:16]) == (1, 1)
    # Blocks of at most 32 KiB uncompressed, each int32-length-prefixed raw snappy.
    pos, out = 16, b""
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        block = bytes(cramjam.snappy.decompress_raw(packed[pos + 4 : pos + 4 + length]))
        assert len(block) <= 32 * 1024
        out += block
        pos += 4 + length
    assert out == DATA


def test_snappy_decompresses_raw_blocks_like_librdkafka_writes():
    raw = bytes(cramjam.snappy.compress_raw(DATA))
    assert not is_xerial(raw)
    assert bytes(decompress(2, raw)) == DATA


def test_snappy_decompresses_xerial_written_by_another_implementation():
    framed = aiokafka_snappy_encode(DATA, xerial_compatible=True, xerial_blocksize=4096)
    assert framed[:8] == XERIAL_MAGIC
    assert bytes(decompress(2, framed)) == DATA


def test_xerial_concatenated_streams_and_odd_versions():
    first, second = DATA[:1000], DATA[1000:3000]
    stream = xerial_compress(first, block_size=300) + xerial_compress(second, block_size=700)
    assert bytes(snappy_decompress(stream)) == first + second
    # snappy-java has written other version numbers in the header; they do not change the framing.
    other = bytearray(xerial_compress(first))
    other[8:16] = struct.pack(">ii", 2, 1)
    assert bytes(snappy_decompress(other)) == first


def test_xerial_block_length_past_end_is_an_error():
    framed = bytearray(xerial_compress(DATA[:5000]))
    struct.pack_into(">i", framed, 16, len(framed))  # first block claims more bytes than exist
    with pytest.raises(CompressionError, match="runs past"):
        decompress(2, framed)
    with pytest.raises(CompressionError):
        decompress(2, bytes(xerial_compress(DATA[:5000]))[:-3])


def test_snappy_max_output_is_checked_before_allocation():
    raw = bytes(cramjam.snappy.compress_raw(b"\x00" * 100_000))
    with pytest.raises(CompressionError, match="limit"):
        decompress(2, raw, max_output=50_000)
    with pytest.raises(CompressionError, match="limit"):
        decompress(2, xerial_compress(b"\x00" * 100_000), max_output=50_000)
    assert decompress(2, raw, max_output=100_000).nbytes == 100_000


# --- lz4 --------------------------------------------------------------------------------------------

def _lz4_blocks(frame: bytes) -> tuple[int, list[tuple[bool, bytes]]]:
    """Split an lz4 frame into (compressed?, block data); FLG must have no content size/dict id."""
    flg = frame[4]
    assert not flg & 0x08 and not flg & 0x01
    pos = 7  # magic, FLG, BD, HC
    blocks = []
    while True:
        (size,) = struct.unpack_from("<I", frame, pos)
        pos += 4
        if size == 0:
            break
        uncompressed = bool(size & 0x80000000)
        size &= 0x7FFFFFFF
        blocks.append((not uncompressed, frame[pos : pos + size]))
        pos += size + (4 if flg & 0x10 else 0)
    return flg, blocks


def test_lz4_frame_has_independent_blocks_kafka_can_read():
    # Repetition across 64 KiB block boundaries: a linked-block encoder would refer back across them.
    chunk = os.urandom(20_000)
    data = chunk * 20
    frame = compress(3, data)
    assert frame[:4] == b"\x04\x22\x4d\x18"
    flg, blocks = _lz4_blocks(frame)
    assert flg >> 6 == 0b01  # frame format version 1
    assert flg & LZ4_FLG_BLOCK_INDEPENDENT
    assert not flg & 0x04  # no content checksum: Kafka's writer never sets it
    assert lz4_blocks_independent(frame)
    assert len(blocks) > 1
    # Each block decompresses on its own, which is exactly what Kafka's Lz4BlockInputStream does.
    out = b"".join(bytes(cramjam.lz4.decompress_block(b, output_len=64 * 1024)) if compressed else b
                   for compressed, b in blocks)
    assert out == data


def test_lz4_decompresses_linked_block_frames_too():
    linked = bytes(cramjam.lz4.compress(DATA))  # cramjam's default frame: linked blocks, content checksum
    assert not lz4_blocks_independent(linked)
    assert bytes(decompress(3, linked)) == DATA


def test_lz4_max_output():
    with pytest.raises(CompressionError, match="limit"):
        decompress(3, compress(3, DATA), max_output=100)


# --- zstd and gzip ----------------------------------------------------------------------------------

def test_zstd_frame_without_content_size():
    streaming = cramjam.zstd.Compressor(3)
    streaming.compress(DATA)
    frame = bytes(streaming.finish())
    assert frame[:4] == b"\x28\xb5\x2f\xfd"
    assert frame[4] >> 6 == 0 and not frame[4] & 0x20  # Frame_Content_Size_flag 0, not single segment
    assert bytes(decompress(4, frame)) == DATA


def test_gzip_several_members_and_limit():
    members = gzip.compress(DATA[:100]) + gzip.compress(DATA[100:300])
    assert bytes(decompress(1, members)) == DATA[:300]
    assert bytes(decompress(1, members, max_output=300)) == DATA[:300]
    with pytest.raises(CompressionError, match="limit"):
        decompress(1, members, max_output=299)
    with pytest.raises(CompressionError):
        decompress(1, gzip.compress(DATA)[:-20], max_output=10**9)


@pytest.mark.parametrize("codec", CODECS)
def test_max_output_exact_boundary(codec):
    packed = compress(codec, DATA)
    assert bytes(decompress(codec, packed, max_output=len(DATA))) == DATA
    assert bytes(decompress(codec, packed, max_output=10 * len(DATA))) == DATA
    with pytest.raises(CompressionError, match="limit"):
        decompress(codec, packed, max_output=len(DATA) - 1)


def test_decompression_bomb_is_stopped_without_inflating_it():
    streaming = cramjam.zstd.Compressor(3)
    zeros = bytes(16 << 20)
    for _ in range(8):
        streaming.compress(zeros)
    bomb = bytes(streaming.finish())  # 128 MiB of zeros in a few KB
    assert len(bomb) < 64 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(CompressionError, match="limit"):
            decompress(4, bomb, max_output=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
