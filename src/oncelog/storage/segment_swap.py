"""Putting rewritten segments in place of their sources so that a crash at any step leaves the old segments or the
new ones, never a mix and never a lost record (Kafka's `.cleaned` -> `.swap` protocol, docs/log-cleaner.md §4).

Part of the log's on-disk format, not of the cleaner: the cleaner writes the new files into the scratch directory,
the log swaps them in (`PartitionLog.replace_segments`) and every load of a partition finishes or drops what a
crash left (`recover`, from `PartitionLog._load`).

The steps, for a chunk of groups of new files, each group's sources covering the offsets [base, end) (the cleaner
swaps a round a few groups at a time: every step costs a directory fsync, paid once a chunk, not once a group):

1. the new segments' files were written into the scratch directory and fsynced (`cleaner.segment_cleaner`);
2. `stage`: each file is renamed into the partition directory as `<name>.swap`, the directory fsynced;
3. `commit`: `<first base>.swapend`, listing every group's base and end, is written atomically: the commit point;
4. the log deletes its old segments in each [base, end) (renamed `.deleted`, unlinked after file.delete.delay.ms);
5. `finish`: each `.swap` file is renamed to its final name, the directory fsynced, then the `.swapend` removed.

`recover`, run when a partition is opened, before its segments are listed: the scratch directory goes; a group
listed in a `.swapend` is committed, so its old files in [base, end) go (a final name at `base` is old only while
its `.swap` twin still exists) and the renames of step 5 are done again; `.swap` files of no listed group were
never committed and go. Every step of `recover` may itself be cut by a crash and run again. (A `.swapend` holding
a single number is one group at the file's base: the format before chunks.)
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import NamedTuple

from .checkpoints import atomic_write, fsync_dir
from .segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_path
from .txn_index import SUFFIX as TXN_INDEX_SUFFIX

log = logging.getLogger(__name__)

SCRATCH_DIR = "cleaner-scratch"  # inside the partition directory; never a legal segment file name
SWAP_SUFFIX = ".swap"
COMMIT_SUFFIX = ".swapend"
# The log file last: a group whose .log is staged has every other file staged too.
SEGMENT_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX)


class SwapGroup(NamedTuple):
    """New files at `base_offset` in the scratch directory, replacing the segments that cover [base, next)."""

    base_offset: int
    next_offset: int


def scratch_dir(directory: str) -> str:
    return os.path.join(directory, SCRATCH_DIR)


def stage(directory: str, groups: list[SwapGroup]) -> None:
    """Step 2: the groups' scratch files renamed to `<name>.swap` in the partition directory, durably."""
    scratch = scratch_dir(directory)
    for group in groups:
        for suffix in SEGMENT_SUFFIXES:
            source = segment_path(scratch, group.base_offset, suffix)
            if os.path.exists(source):
                os.replace(source, segment_path(directory, group.base_offset, suffix) + SWAP_SUFFIX)
    fsync_dir(directory)


def commit(directory: str, groups: list[SwapGroup]) -> None:
    """Step 3: from here the cleaned groups replace their sources, whatever happens next."""
    listing = "\n".join(f"{g.base_offset} {g.next_offset}" for g in groups)
    atomic_write(_commit_path(directory, groups[0].base_offset), listing.encode())


def finish(directory: str, groups: list[SwapGroup]) -> None:
    """Step 5 (after the log removed its old segments in the groups' ranges): the final names."""
    for group in groups:
        for suffix in SEGMENT_SUFFIXES:
            swapped = segment_path(directory, group.base_offset, suffix) + SWAP_SUFFIX
            if os.path.exists(swapped):
                os.replace(swapped, segment_path(directory, group.base_offset, suffix))
    fsync_dir(directory)
    os.unlink(_commit_path(directory, groups[0].base_offset))
    fsync_dir(directory)


def drop_transaction_index(directory: str, base_offset: int) -> None:
    """A replaced segment's transaction index (the log's segment objects do not own that file)."""
    try:
        os.unlink(segment_path(directory, base_offset, TXN_INDEX_SUFFIX))
    except FileNotFoundError:
        pass


def discard_scratch(directory: str) -> None:
    shutil.rmtree(scratch_dir(directory), ignore_errors=True)


def _listed(marker_base: int, text: str) -> list[SwapGroup]:
    lines = text.split()
    if len(lines) == 1:  # one group at the marker's base (the format before chunks)
        return [SwapGroup(marker_base, int(lines[0]))]
    pairs = text.splitlines()
    return [SwapGroup(int(b), int(e)) for b, e in (line.split() for line in pairs)]


def recover(directory: str) -> int:
    """Finish committed swaps and drop uncommitted ones (module docstring); the number of groups finished."""
    discard_scratch(directory)
    names = os.listdir(directory)
    chunks: list[list[SwapGroup]] = []
    for name in names:
        if name.endswith(COMMIT_SUFFIX) and name[:20].isdigit():
            try:
                with open(os.path.join(directory, name), "rb") as f:
                    chunks.append(_listed(int(name[:20]), f.read().decode()))
            except (OSError, ValueError) as exc:  # atomic_write makes this impossible short of a damaged disk
                log.error("%s: unreadable %s (%s); its swap is not finished", directory, name, exc)
    committed = {g.base_offset: g.next_offset for chunk in chunks for g in chunk}
    for name in names:
        if name.endswith(COMMIT_SUFFIX + ".tmp"):
            os.unlink(os.path.join(directory, name))  # a commit that atomic_write never finished
        elif name.endswith(SWAP_SUFFIX) and name[:20].isdigit() and int(name[:20]) not in committed:
            log.warning("%s: removing %s, a cleaned segment that was never committed", directory, name)
            os.unlink(os.path.join(directory, name))
    for chunk in sorted(chunks):
        for base, end in chunk:
            for name in names:
                stem, dot, suffix = name.partition(".")
                if len(stem) != 20 or not stem.isdigit() or "." + suffix not in SEGMENT_SUFFIXES:
                    continue
                old_base = int(stem)
                if not base <= old_base < end:
                    continue
                path = os.path.join(directory, name)
                if old_base == base and not os.path.exists(path + SWAP_SUFFIX):
                    continue  # already the cleaned file (step 5 ran for it before the crash)
                if os.path.exists(path):
                    os.unlink(path)
        fsync_dir(directory)
        finish(directory, chunk)
        log.info("%s: finished the swap of %d cleaned segments from %d (offsets up to %d)", directory, len(chunk),
                 chunk[0].base_offset, chunk[-1].next_offset)
    return len(committed)


def _commit_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, f"{base_offset:020d}{COMMIT_SUFFIX}")
