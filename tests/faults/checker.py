"""The checker: turns the histories of a fault run and a final read of the log into anomaly counts.

Vocabulary as in Jepsen's Kafka analyses. Definitions, for a topic whose records carry unique values:
- lost write: acknowledged by a non-transactional send, or sent in a transaction whose commit was acknowledged,
  and absent from the final read_committed scan (unless DeleteRecords removed its offset).
- duplicate: one value at two or more offsets (anywhere: acks, reads, final scans).
- aborted read (G1a): a read_committed read of a value whose transaction was aborted or never committed.
- uncommitted read: a read_committed read of a transactional value that completed before its transaction's commit
  was even invoked.
- reordering: one producer's values to one partition, in send order, land at offsets that are not increasing.
- nonmonotonic poll: within one consumer session, a partition's offsets do not strictly increase.
- inconsistent offset: one (partition, offset) seen with two different values.
- phantom: a value read that no worker ever tried to write.
- hanging transaction: a partition's last stable offset stayed below its high watermark, unchanged, for longer than
  the transaction timeout plus a margin; or was still below it after the run healed.
Consumer groups (members log `assign` at each assignment, `read`s tagged with their group and session, and
`commit`s of the offsets after what they read):
- lost commit: a member's session starts reading a partition below an offset whose commit by the group was
  acknowledged before that assignment (the coordinator forgot an acknowledged OffsetCommit).
- group skip: an offset below the group's final committed offset that no member of the group ever read (members
  commit only what they read, so the group skipped records: at-least-once broken).
Clusters (filled in by the cluster runner from the replicas' segment files, tests/faults/replicas.py):
- replica divergence: two replicas of a partition hold different batches at one offset.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ANOMALIES = (
    "lost_writes", "duplicates", "aborted_reads", "uncommitted_reads", "reordering", "nonmonotonic_polls",
    "inconsistent_offsets", "phantoms", "hanging_transactions", "lost_commits", "group_skips",
    "replica_divergence", "under_replicated",
)


@dataclass
class FinalRead:
    """What the runner read after healing: every partition from its log start to the end."""

    committed: dict[int, list[tuple[int, str]]]  # read_committed: partition -> [(offset, value)]
    uncommitted: dict[int, list[tuple[int, str]]]  # read_uncommitted, control records left out
    log_start: dict[int, int]
    lso_caught_up: dict[int, bool] = field(default_factory=dict)  # LSO == HWM after the heal wait


@dataclass
class Report:
    anomalies: dict[str, list[Any]]
    counts: dict[str, int]

    @property
    def ok(self) -> bool:
        return not any(self.anomalies.values())


def check(events: Iterable[dict[str, Any]], final: FinalRead, *, txn_timeout_s: float = 60.0,
          margin_s: float = 10.0, expected: Iterable[str] = (), possible: Iterable[str] = (),
          group_committed: Mapping[str, Mapping[int, int]] | None = None) -> Report:
    """Check one topic. `expected`: values that must be in the final read_committed scan whatever the histories
    say (an exactly-once copy's output for every acknowledged input). `possible`: values that may be there
    without a writer in the histories (a copy of an input whose send was never answered: its producer was
    killed after the broker wrote it), so they are no phantoms. `group_committed`: {group: {partition: its
    committed offset after the run}} of the consumer groups that read the topic."""
    events = sorted(events, key=lambda e: e["t"])
    found: dict[str, list[Any]] = {name: [] for name in ANOMALIES}

    # value -> its send attempts (a copier that crashed sends the same value again, in a new transaction)
    attempts: dict[str, dict[tuple[str, Any], dict[str, Any]]] = defaultdict(dict)
    txn_state: dict[str, str] = {}
    commit_invoked_at: dict[str, float] = {}
    deleted_before: dict[int, int] = defaultdict(int)
    reads: list[dict[str, Any]] = []
    lso_samples: dict[int, list[dict[str, Any]]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)

    for e in events:
        op = e["op"]
        if op == "send":
            key = (e["w"], e.get("txn"))
            a = attempts[e["v"]].setdefault(key, {"w": e["w"], "p": e["p"], "seq": e["seq"], "txn": e.get("txn"),
                                                  "acked": False, "offset": None})
            if e["phase"] == "ok":
                a["acked"] = True
                offset = e.get("offset")
                if offset is not None and offset >= 0:  # None or -1: acknowledged without an offset (46)
                    a["offset"] = offset
                counts["acked_sends"] += 1
            elif e["phase"] == "invoke":
                counts["sends"] += 1
        elif op == "txn":
            phase, txn = e["phase"], e["txn"]
            if phase == "commit-invoke":
                commit_invoked_at.setdefault(txn, e["t"])
            if phase == "commit-ok":
                txn_state[txn] = "committed"
                counts["commits"] += 1
            elif phase == "abort-ok":
                txn_state.setdefault(txn, "aborted")
                counts["aborts"] += 1
            elif phase == "begin":
                txn_state.setdefault(txn, "unknown")
        elif op == "read":
            reads.append(e)
            counts["reads"] += 1
        elif op == "delete":
            deleted_before[e["p"]] = max(deleted_before[e["p"]], e["before"])
            counts["deletes"] += 1
        elif op == "lso":
            lso_samples[e["p"]].append(e)
        elif op == "fault" and e["phase"] == "start":
            counts["faults"] += 1

    def committed_attempt(a: dict[str, Any]) -> bool:
        return (a["txn"] is None and a["acked"]) or (a["txn"] is not None and txn_state.get(a["txn"]) == "committed")

    # Where each value is. `committed_at`: views that only ever show committed data (acks of committed sends,
    # read_committed reads, the final read_committed scan); `anywhere`: every view, for offset consistency.
    committed_at: dict[str, set[tuple[int, int]]] = defaultdict(set)
    anywhere: dict[str, set[tuple[int, int]]] = defaultdict(set)
    by_offset: dict[tuple[int, int], set[str]] = defaultdict(set)

    def saw(value: str, partition: int, offset: int, committed: bool) -> None:
        anywhere[value].add((partition, offset))
        by_offset[(partition, offset)].add(value)
        if committed:
            committed_at[value].add((partition, offset))

    for value, tries in attempts.items():
        for a in tries.values():
            if a["offset"] is not None:
                saw(value, a["p"], a["offset"], committed_attempt(a))
    for e in reads:
        saw(e["v"], e["p"], e["offset"], e["iso"] == "rc")
    final_rc_values: set[str] = set()
    for partition, records in final.committed.items():
        for offset, value in records:
            saw(value, partition, offset, True)
            final_rc_values.add(value)
    for partition, records in final.uncommitted.items():
        for offset, value in records:
            saw(value, partition, offset, False)
    expected = set(expected)
    possible = set(possible)

    for value, places in committed_at.items():
        if len(places) > 1:
            found["duplicates"].append({"v": value, "at": sorted(places)})
    for value, places in anywhere.items():
        if value not in attempts and value not in expected and value not in possible:
            found["phantoms"].append({"v": value, "at": sorted(places)})
    for place, values in by_offset.items():
        if len(values) > 1:
            found["inconsistent_offsets"].append({"p": place[0], "offset": place[1], "values": sorted(values)})

    def deleted(value: str, partition: int) -> bool:
        """Whether DeleteRecords may legitimately have taken `value` away."""
        start = max(deleted_before[partition], final.log_start.get(partition, 0))
        if start == 0:
            return False
        offsets = [o for p, o in anywhere.get(value, ()) if p == partition]
        return not offsets or min(offsets) < start

    for value in set(attempts) | expected:
        tries = attempts.get(value, {})
        if value in final_rc_values:
            continue
        must = value in expected or any(committed_attempt(a) for a in tries.values())
        partition = next(iter(tries.values()))["p"] if tries else None
        if must and not (partition is not None and deleted(value, partition)):
            found["lost_writes"].append({"v": value, "p": partition,
                                         "txns": sorted(str(a["txn"]) for a in tries.values())})

    for e in reads:
        if e["iso"] != "rc" or e["v"] not in attempts:
            continue
        tries = list(attempts[e["v"]].values())
        if any(a["txn"] is None for a in tries):
            continue
        same_offset = [a for a in tries if a["offset"] == e["offset"]]
        aborted_here = any(txn_state.get(a["txn"]) == "aborted" for a in same_offset)
        if aborted_here or (e["v"] not in final_rc_values and not deleted(e["v"], e["p"])):
            found["aborted_reads"].append({"v": e["v"], "reader": e["w"], "offset": e["offset"],
                                           "txns": sorted(str(a["txn"]) for a in tries)})
            continue
        committed = [a["txn"] for a in tries if txn_state.get(a["txn"]) == "committed"]
        invoked = [commit_invoked_at[t] for t in committed if t in commit_invoked_at]
        if committed and (not invoked or e["t"] < min(invoked)):
            found["uncommitted_reads"].append({"v": e["v"], "reader": e["w"], "txns": committed})

    # Reordering: a producer's committed values per partition, by send sequence, must have rising offsets.
    per_producer: dict[tuple[str, int], list[tuple[int, int, str]]] = defaultdict(list)
    for value, tries in attempts.items():
        places = committed_at.get(value, set())
        if len(places) != 1:
            continue
        partition, offset = next(iter(places))
        for a in tries.values():
            if committed_attempt(a) and a["p"] == partition:
                per_producer[(a["w"], partition)].append((a["seq"], offset, value))
    for (worker, partition), items in per_producer.items():
        items.sort()
        for (_, off_a, va), (_, off_b, vb) in zip(items, items[1:], strict=False):
            if off_b <= off_a:
                found["reordering"].append({"w": worker, "p": partition, "first": [va, off_a], "then": [vb, off_b]})

    last_offset: dict[tuple[str, Any, int], int] = {}
    for e in reads:
        key = (e["w"], e.get("session"), e["p"])
        previous = last_offset.get(key)
        if previous is not None and e["offset"] <= previous:
            found["nonmonotonic_polls"].append({"w": e["w"], "p": e["p"], "after": previous, "got": e["offset"]})
        last_offset[key] = e["offset"]

    limit = txn_timeout_s + margin_s
    for partition, samples in lso_samples.items():
        stuck_since: tuple[int, float] | None = None
        for sample in samples:
            lso, hwm = sample["lso"], sample["hwm"]
            if lso < 0 or lso >= hwm:
                stuck_since = None
                continue
            if stuck_since is None or stuck_since[0] != lso:
                stuck_since = (lso, sample["t"])
            elif sample["t"] - stuck_since[1] > limit:
                found["hanging_transactions"].append({"p": partition, "lso": lso,
                                                      "stuck_s": round(sample["t"] - stuck_since[1], 1)})
                stuck_since = (lso, float("inf"))  # one report per stuck period
    for partition, caught_up in final.lso_caught_up.items():
        if not caught_up:
            found["hanging_transactions"].append({"p": partition, "final": "LSO below the high watermark"})

    for group, committed in (group_committed or {}).items():
        found["lost_commits"].extend(_lost_commits(events, group))
        found["group_skips"].extend(_group_skips(events, group, committed, final))
        counts["group_commits"] += sum(1 for e in events if e["op"] == "commit" and e.get("group") == group
                                       and e["phase"] == "ok")

    counts["final_committed_records"] = sum(len(r) for r in final.committed.values())
    return Report(found, dict(counts))


def _lost_commits(events: list[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """Sessions of `group` that started reading a partition below a commit acknowledged before they began."""
    acked: dict[int, list[tuple[float, int]]] = defaultdict(list)  # partition -> (ack time, offset)
    starts: dict[tuple[str, int], float] = {}  # (session, partition) -> when the assignment began
    first_read: dict[tuple[str, int], dict[str, Any]] = {}
    for e in events:
        if e.get("group") != group:
            continue
        if e["op"] == "commit" and e["phase"] == "ok":
            for partition, offset in e["offsets"]:
                acked[partition].append((e["t"], offset))
        elif e["op"] == "assign":
            for partition in e["partitions"]:
                starts[(e["session"], partition)] = e["t"]
        elif e["op"] == "read":
            first_read.setdefault((e["session"], e["p"]), e)
    found = []
    for (session, partition), began in starts.items():
        read = first_read.get((session, partition))
        if read is None:
            continue
        before = [offset for t, offset in acked[partition] if t < began]
        if before and read["offset"] < max(before):
            found.append({"session": session, "p": partition, "first_read": read["offset"],
                          "acknowledged_commit": max(before)})
    return found


def _group_skips(events: list[dict[str, Any]], group: str, committed: Mapping[int, int],
                 final: FinalRead) -> list[dict[str, Any]]:
    """Records below the group's final committed offset that no member read."""
    read = {(e["p"], e["offset"]) for e in events if e["op"] == "read" and e.get("group") == group}
    found = []
    for partition, records in final.committed.items():
        end = committed.get(partition, -1)
        for offset, value in records:
            if offset < end and (partition, offset) not in read:
                found.append({"p": partition, "offset": offset, "v": value, "committed": end})
    return found
