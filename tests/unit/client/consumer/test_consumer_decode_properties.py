"""Property test of read_committed decoding against a model: random interleavings of transactional producers
(committing or aborting), idempotent and plain producers, read in random fetch-sized pieces the way the
consumer reads a log, with the aborted-transaction list a broker would send for each piece."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.client.consumer.decode import decode_fetch
from oncelog.records.builder import BatchBuilder
from oncelog.records.control import build_marker


@dataclass
class Log:
    batches: list[bytes] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # base offset of each batch
    end: int = 0
    # every data record: (offset, value, producer id, transactional)
    records: list[tuple[int, bytes, int, bool]] = field(default_factory=list)
    aborted: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, first offset, marker offset)

    def append(self, data: bytes, records: int) -> int:
        base = self.end
        self.batches.append(data)
        self.starts.append(base)
        self.end += records
        return base


def _batch(base: int, values: list[bytes], pid: int, txn: bool, codec: int) -> bytes:
    b = BatchBuilder(codec, transactional=txn)
    for v in values:
        b.append(None, v, (), 1_700_000_000_000)
    return bytes(b.build(base_offset=base, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                         base_sequence=0 if pid >= 0 else -1))


# An operation: (kind, producer, number of records, codec); kinds: "txn" appends a batch to the producer's
# open transaction, "commit"/"abort" end it, "plain" appends a non-transactional batch.
op = st.tuples(st.sampled_from(["txn", "txn", "commit", "abort", "plain"]), st.integers(0, 1), st.integers(1, 4),
               st.sampled_from([0, 0, 1, 4]))


def build(ops: list[tuple[str, int, int, int]]) -> Log:
    log = Log()
    open_txns: dict[int, int] = {}  # pid -> first offset of its open transaction
    counter = 0
    for kind, producer, n, codec in ops:
        pid = 100 + producer
        if kind in ("commit", "abort"):
            if pid not in open_txns:
                continue
            first = open_txns.pop(pid)
            marker_at = log.append(bytes(build_marker(pid, 0, kind == "commit", 1, 1, base_offset=log.end)), 1)
            if kind == "abort":
                log.aborted.append((pid, first, marker_at))
            continue
        values = [b"%d" % (counter + i) for i in range(n)]
        counter += n
        txn = kind == "txn"
        base = log.append(_batch(log.end, values, pid if txn else -1, txn, codec), n)
        log.records += [(base + i, v, pid, txn) for i, v in enumerate(values)]
        if txn:
            open_txns.setdefault(pid, base)
    # Open transactions at the end are beyond the last stable offset: cut the log before the first of them.
    if open_txns:
        lso = min(open_txns.values())
        keep = [i for i, start in enumerate(log.starts) if start < lso]
        log.batches = [log.batches[i] for i in keep]
        log.starts = [log.starts[i] for i in keep]
        log.end = lso
        log.records = [r for r in log.records if r[0] < lso]
    return log


def expected(log: Log, read_committed: bool) -> list[tuple[int, bytes]]:
    """Model: every data record, except (read_committed) those of a transaction that was aborted."""
    return [(offset, value) for offset, value, pid, txn in log.records
            if not (read_committed and txn and any(p == pid and first <= offset < marker
                                                   for p, first, marker in log.aborted))]


def read(log: Log, piece_bytes: int, read_committed: bool) -> list[tuple[int, bytes]]:
    """Sequential fetches of at most `piece_bytes` (at least one whole batch, as brokers answer)."""
    blob = b"".join(log.batches)
    positions = []
    pos = 0
    for data in log.batches:
        positions.append(pos)
        pos += len(data)
    out: list[tuple[int, bytes]] = []
    offset = 0
    guard = 0
    while offset < log.end:
        guard += 1
        assert guard < 10_000, "no progress"
        i = max(k for k, s in enumerate(log.starts) if s <= offset)
        begin = positions[i]
        stop = max(begin + len(log.batches[i]), min(len(blob), begin + piece_bytes))
        piece = blob[begin:stop]
        # the broker lists aborted transactions that overlap the fetched range
        aborted = [(pid, first) for pid, first, marker in log.aborted if marker >= offset] if read_committed else None
        decoded = decode_fetch("t", 0, piece, offset, read_committed=read_committed, aborted=aborted)
        out += [(m.offset(), m.value()) for m in decoded.messages()]
        assert decoded.next_offset > offset
        offset = decoded.next_offset
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(op, min_size=4, max_size=40), st.integers(60, 2000))
def test_read_committed_pieces_match_the_model(ops, piece_bytes):
    log = build(ops)
    assert read(log, piece_bytes, read_committed=True) == expected(log, read_committed=True)
    assert read(log, piece_bytes, read_committed=False) == expected(log, read_committed=False)
