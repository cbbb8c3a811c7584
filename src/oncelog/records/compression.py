"""Kafka's record-batch codecs (attribute bits 0-2): 1 gzip, 2 snappy, 3 lz4, 4 zstd.

Every codec comes from cramjam (one wheel, releases the GIL, takes memoryviews), except gzip
compression, where the stdlib's zlib is faster. What the generic libraries get wrong for Kafka
is handled here:

- snappy: the Java client writes snappy-java's "xerial" stream framing, librdkafka writes raw
  snappy. Readers must accept both; neither cramjam nor python-snappy parses the framing.
  We write the framing too: it is what the Java client writes, so every Java reader takes it.
- lz4: Kafka's Java reader decompresses each block on its own, so frames must be written with
  independent blocks (FLG bit 5). Library defaults use linked blocks. Decompression accepts
  any valid frame, linked or not.
- zstd: streaming compressors omit the frame's content size; cramjam decodes those frames.

A decompressed result can be far larger than its input (a 1 MiB zstd batch can inflate to
gigabytes), so `decompress` takes a `max_output` bound that also bounds the memory it uses.
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from oncelog.records.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    LOG_OVERHEAD,
    OFF_ATTRIBUTES,
    OFF_LENGTH,
    rewrite_crc,
)

Buffer = bytes | bytearray | memoryview

DEFAULT_GZIP_LEVEL = 6  # java.util.zip.Deflater's default, which Kafka's gzip uses
DEFAULT_ZSTD_LEVEL = 3  # Kafka's ZstdCompression.DEFAULT_LEVEL
XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java's default block size

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # stream version 1, compatible with 1
_XERIAL_HEADER_SIZE = len(_XERIAL_HEADER)  # 16
_INT32 = struct.Struct(">i")

# Kafka's compression levels (KIP-390) and what they mean here. lz4: Kafka's default level 9 is lz4-java's fast
# compressor, any other level its high compressor at that level; native lz4 (inside lz4-java as in cramjam) stops
# at level 12, and cramjam's frame compressor takes levels below 3 as its fast mode.
GZIP_LEVEL_DEFAULT = -1  # Kafka's "use the codec's default" (Deflater's 6)
LZ4_LEVEL_DEFAULT = 9
LZ4_HC_MAX_LEVEL = 12
ZSTD_LEVEL_MIN, ZSTD_LEVEL_MAX = -131072, 22

LZ4_MAGIC = b"\x04\x22\x4d\x18"
LZ4_FLG_BLOCK_INDEPENDENT = 0x20


class CompressionError(Exception):
    """Data that a codec cannot compress or decompress, or a codec id Kafka does not define."""


class UnsupportedCodecError(CompressionError):
    """A compression id outside 0-4 (attribute bits 5-7 are not a codec Kafka knows)."""


def codec_name(codec: int) -> str:
    return COMPRESSION_NAMES.get(codec, f"unknown codec {codec}")


def compress(codec: int, data: Buffer, level: int | None = None) -> bytes:
    """Compress `data` the way Kafka's readers (Java, librdkafka) expect for `codec`."""
    try:
        if codec == COMPRESSION_GZIP:
            c = zlib.compressobj(DEFAULT_GZIP_LEVEL if level is None else level, zlib.DEFLATED, 31)
            return c.compress(data) + c.flush()
        if codec == COMPRESSION_SNAPPY:
            return xerial_compress(data)
        if codec == COMPRESSION_LZ4:
            compressor = cramjam.lz4.Compressor(level, content_checksum=False, block_linked=False)
            # Its streaming compressor (the only cramjam lz4 API with block_linked) takes bytes only.
            compressor.compress(data if type(data) is bytes else bytes(data))
            return bytes(compressor.finish())
        if codec == COMPRESSION_ZSTD:
            return bytes(cramjam.zstd.compress(data, level=DEFAULT_ZSTD_LEVEL if level is None else level))
        if codec == COMPRESSION_NONE:
            return bytes(data)
    except (cramjam.CompressionError, zlib.error, ValueError, TypeError) as exc:
        raise CompressionError(f"{codec_name(codec)} compression failed: {exc}") from exc
    raise UnsupportedCodecError(f"Unsupported compression codec id {codec}")


def decompress(codec: int, data: Buffer, max_output: int | None = None) -> memoryview:
    """Decompress a batch's records section; the result is a view, not a copy, of the codec's output.

    Raises CompressionError for corrupt input or output above `max_output` bytes (never holding
    more than about that much memory), and UnsupportedCodecError for an id Kafka does not define.
    """
    try:
        if codec == COMPRESSION_SNAPPY:
            return snappy_decompress(data, max_output)
        module = _CRAMJAM_CODECS.get(codec)
        if module is not None:
            if max_output is None:
                return memoryview(module.decompress(data))
            return _bounded_decompress(codec, module, data, max_output)
        if codec == COMPRESSION_NONE:
            return memoryview(data)
    except CompressionError:
        raise
    except (cramjam.DecompressionError, ValueError, TypeError, OverflowError) as exc:
        raise CompressionError(f"{codec_name(codec)} data is corrupt: {exc}") from exc
    raise UnsupportedCodecError(f"Unsupported compression codec id {codec}")


_CRAMJAM_CODECS = {COMPRESSION_GZIP: cramjam.gzip, COMPRESSION_LZ4: cramjam.lz4, COMPRESSION_ZSTD: cramjam.zstd}
_OUTPUT_FULL = "failed to write whole buffer"  # cramjam's decompress_into error when the output is too small
_FIRST_GUESS_RATIO = 8
_MIN_FIRST_GUESS = 64 * 1024


def _bounded_decompress(codec: int, module, data: Buffer, max_output: int) -> memoryview:
    """Decompress into buffers of growing size, never larger than `max_output` (+1).

    gzip, lz4 and zstd frames need not declare their decompressed size, and cramjam's one-shot
    functions grow their output without limit. `decompress_into` stops when its buffer is full,
    and does so cheaply, so retrying with a buffer 8 times larger costs little compared to the
    one decompression that succeeds. The spare byte tells "exactly fits" from "does not fit".
    """
    size = min(max_output, max(_MIN_FIRST_GUESS, _FIRST_GUESS_RATIO * memoryview(data).nbytes))
    while True:
        out = bytearray(size + 1)
        try:
            written = module.decompress_into(data, out)
        except cramjam.DecompressionError as exc:
            if _OUTPUT_FULL not in str(exc):
                raise
            written = size + 1
        if written <= size:
            return memoryview(out)[:written]
        if size >= max_output:
            raise CompressionError(f"{codec_name(codec)} data inflates to more than the limit of {max_output} bytes")
        size = min(max_output, size * _FIRST_GUESS_RATIO)


def xerial_compress(data: Buffer, block_size: int = XERIAL_BLOCK_SIZE) -> bytes:
    """snappy-java's stream framing: a 16-byte header, then int32-length-prefixed raw snappy blocks."""
    view = memoryview(data)
    parts: list[bytes | bytearray] = [_XERIAL_HEADER]
    for start in range(0, view.nbytes, block_size):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + block_size]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def is_xerial(data: Buffer) -> bool:
    view = memoryview(data)
    return view.nbytes >= _XERIAL_HEADER_SIZE and view[:8] == XERIAL_MAGIC


def snappy_decompress(data: Buffer, max_output: int | None = None) -> memoryview:
    """Raw snappy or xerial-framed snappy, whichever `data` is.

    A raw block can in principle begin with the xerial magic, so a framed parse that fails
    falls back to raw before giving up (librdkafka does the same detection).
    """
    view = memoryview(data)
    if is_xerial(view):
        try:
            return _xerial_decompress(view, max_output)
        except CompressionError as framed_error:
            try:
                return _raw_snappy(view, max_output)
            except CompressionError:
                raise framed_error from None
    return _raw_snappy(view, max_output)


def _raw_snappy(view: memoryview, max_output: int | None) -> memoryview:
    try:
        if max_output is not None:
            declared = cramjam.snappy.decompress_raw_len(view)
            if declared > max_output:
                raise CompressionError(f"snappy data declares {declared} bytes, above the limit of {max_output}")
        return memoryview(cramjam.snappy.decompress_raw(view))
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"snappy data is corrupt: {exc}") from exc


def _xerial_decompress(view: memoryview, max_output: int | None) -> memoryview:
    end = view.nbytes
    pos = _XERIAL_HEADER_SIZE
    blocks: list[memoryview] = []
    total = 0
    while pos < end:
        # snappy-java's reader accepts concatenated streams: a header may reappear between blocks.
        if end - pos >= _XERIAL_HEADER_SIZE and view[pos : pos + 8] == XERIAL_MAGIC:
            pos += _XERIAL_HEADER_SIZE
            continue
        if end - pos < 4:
            raise CompressionError(f"xerial snappy stream is truncated: {end - pos} stray bytes at the end")
        length = _INT32.unpack_from(view, pos)[0]
        pos += 4
        if length < 0 or pos + length > end:
            raise CompressionError(
                f"xerial snappy block length {length} at byte {pos - 4} runs past the end of the data ({end} bytes)"
            )
        limit = None if max_output is None else max_output - total
        block = _raw_snappy(view[pos : pos + length], limit)
        total += block.nbytes
        blocks.append(block)
        pos += length
    if len(blocks) == 1:
        return blocks[0]
    return memoryview(b"".join(blocks))


def lz4_blocks_independent(frame: Buffer) -> bool:
    """Whether an lz4 frame's FLG byte marks its blocks independent (what Kafka's Java reader needs)."""
    view = memoryview(frame)
    if view.nbytes < 6 or view[:4] != LZ4_MAGIC:
        raise CompressionError("not an lz4 frame")
    return bool(view[4] & LZ4_FLG_BLOCK_INDEPENDENT)


def inflate_batch(batch: Buffer, max_output: int | None = None) -> bytearray:
    """The same batch with its records section decompressed and the codec bits cleared.

    Record parsers (aiokafka's Cython one included) want a whole batch buffer; handing them a
    rebuilt uncompressed batch keeps decompression (and its Kafka quirks) in this module. The
    length and CRC fields are left stale: the result is for reading, never for storing.
    """
    view = memoryview(batch)
    codec = view[OFF_ATTRIBUTES + 1] & COMPRESSION_MASK
    records = decompress(codec, view[HEADER_SIZE:], max_output)
    out = bytearray(view[:HEADER_SIZE])
    out += records  # not `out[61:] = records`: from a memoryview that took 1.3 ms per MiB here, this 25 us
    out[OFF_ATTRIBUTES + 1] &= ~COMPRESSION_MASK & 0xFF
    return out


def library_level(codec: int, kafka_level: int | None) -> int | None:
    """The level `compress` takes for a Kafka compression level of `codec` (None: the codec's default)."""
    if kafka_level is None:
        return None
    if codec == COMPRESSION_GZIP:
        return None if kafka_level == GZIP_LEVEL_DEFAULT else kafka_level
    if codec == COMPRESSION_LZ4:
        return None if kafka_level == LZ4_LEVEL_DEFAULT else min(kafka_level, LZ4_HC_MAX_LEVEL)
    if codec == COMPRESSION_ZSTD:
        return kafka_level
    return None


def recompress_batch(batch: Buffer, target: int, level: int | None = None,
                     max_output: int | None = None) -> bytearray:
    """The same batch with its records section in codec `target` (Kafka's broker-side recompression).

    A v2 batch's records section is the same bytes whether it is compressed or not, and offset and
    timestamp deltas are relative to the header's base offset and base timestamp: decompressing the
    section and compressing it again keeps every record byte-identical (keys, values, headers, null
    values, deltas), so no record is decoded. The header keeps its producer id, epoch, base sequence,
    transactional bit and timestamps; only the codec bits, the length and the CRC change.
    `level` is the library's level (see `library_level`). Raises CompressionError like `decompress`.
    """
    view = memoryview(batch)
    size = LOG_OVERHEAD + int.from_bytes(view[OFF_LENGTH:OFF_LENGTH + 4], "big", signed=True)
    source = view[OFF_ATTRIBUTES + 1] & COMPRESSION_MASK
    records = view[HEADER_SIZE:size]
    if source != COMPRESSION_NONE:
        records = decompress(source, records, max_output)
    body = compress(target, records, level) if target != COMPRESSION_NONE else records
    out = bytearray(view[:HEADER_SIZE])
    out += body
    out[OFF_LENGTH:OFF_LENGTH + 4] = (len(out) - LOG_OVERHEAD).to_bytes(4, "big")
    out[OFF_ATTRIBUTES + 1] = (out[OFF_ATTRIBUTES + 1] & ~COMPRESSION_MASK & 0xFF) | target
    rewrite_crc(out, 0, len(out))
    return out
