"""The checker finds each anomaly it names, and nothing in a clean history (pure logic, no broker)."""

from __future__ import annotations

import pytest

from tests.faults.checker import ANOMALIES, FinalRead, check


def send(w, v, p, seq, phase="ok", offset=None, txn=None, t=1.0):
    e = {"op": "send", "w": w, "v": v, "p": p, "seq": seq, "txn": txn, "phase": phase, "t": t}
    if offset is not None:
        e["offset"] = offset
    return e


def txn(w, name, phase, t):
    return {"op": "txn", "w": w, "txn": name, "phase": phase, "t": t}


def read(w, v, p, offset, iso="rc", session=0, t=5.0):
    return {"op": "read", "w": w, "v": v, "p": p, "offset": offset, "iso": iso, "session": session, "t": t}


def clean_history():
    events = [
        send("a", "a:0", 0, 0, "invoke", t=0.1), send("a", "a:0", 0, 0, "ok", 0, t=0.2),
        send("a", "a:1", 0, 1, "invoke", t=0.3), send("a", "a:1", 0, 1, "ok", 1, t=0.4),
        txn("b", "b-t0", "begin", 1.0),
        send("b", "b:0", 0, 0, "invoke", txn="b-t0", t=1.1), send("b", "b:0", 0, 0, "ok", 2, txn="b-t0", t=1.2),
        txn("b", "b-t0", "commit-invoke", 1.3), txn("b", "b-t0", "commit-ok", 1.4),
        txn("b", "b-t1", "begin", 2.0),
        send("b", "b:1", 0, 1, "invoke", txn="b-t1", t=2.1), send("b", "b:1", 0, 1, "ok", 4, txn="b-t1", t=2.2),
        txn("b", "b-t1", "abort-invoke", 2.3), txn("b", "b-t1", "abort-ok", 2.4),
        read("r", "a:0", 0, 0), read("r", "a:1", 0, 1), read("r", "b:0", 0, 2),
        {"op": "lso", "w": "m", "p": 0, "lso": 6, "hwm": 6, "t": 3.0},
    ]
    final = FinalRead(
        committed={0: [(0, "a:0"), (1, "a:1"), (2, "b:0")]},
        uncommitted={0: [(0, "a:0"), (1, "a:1"), (2, "b:0"), (4, "b:1")]},
        log_start={0: 0}, lso_caught_up={0: True},
    )
    return events, final


def test_clean_history_has_no_anomaly():
    events, final = clean_history()
    report = check(events, final)
    assert report.ok, report.anomalies
    assert report.counts["acked_sends"] == 4 and report.counts["commits"] == 1 and report.counts["aborts"] == 1


def only(report, name):
    assert report.anomalies[name], f"{name} not found"
    others = {k: v for k, v in report.anomalies.items() if v and k != name}
    assert not others, others


def test_lost_write():
    events, final = clean_history()
    final.committed[0].remove((1, "a:1"))
    final.uncommitted[0].remove((1, "a:1"))
    events = [e for e in events if not (e["op"] == "read" and e["v"] == "a:1")]
    only(check(events, final), "lost_writes")


def test_deleted_records_are_not_lost():
    events, final = clean_history()
    final.committed[0] = final.committed[0][2:]
    final.uncommitted[0] = final.uncommitted[0][2:]
    final.log_start[0] = 2
    events = [e for e in events if e["op"] != "read"] + [{"op": "delete", "w": "d", "p": 0, "before": 2, "t": 2.5}]
    assert check(events, final).ok


def test_lost_committed_transactional_write():
    events, final = clean_history()
    final.committed[0].remove((2, "b:0"))
    final.uncommitted[0].remove((2, "b:0"))
    events = [e for e in events if not (e["op"] == "read" and e["v"] == "b:0")]
    only(check(events, final), "lost_writes")


def test_duplicate():
    events, final = clean_history()
    final.committed[0].append((5, "a:0"))
    final.uncommitted[0].append((5, "a:0"))
    report = check(events, final)
    assert report.anomalies["duplicates"] == [{"v": "a:0", "at": [(0, 0), (0, 5)]}]
    # the second copy also lands after a:1, which is a reordering of a's sends
    assert report.anomalies["reordering"] == []


def test_aborted_read():
    events, final = clean_history()
    events.append(read("r", "b:1", 0, 4, session=3, t=3.0))
    only(check(events, final), "aborted_reads")


def test_read_uncommitted_may_see_aborted_data():
    events, final = clean_history()
    events.append(read("r", "b:1", 0, 4, iso="ru", session=1, t=3.0))
    assert check(events, final).ok


def test_uncommitted_read():
    events, final = clean_history()
    events.append(read("r2", "b:0", 0, 2, t=1.25))  # before commit-invoke at 1.3
    only(check(events, final), "uncommitted_reads")


def test_reordering():
    events, final = clean_history()
    final.committed[0] = [(0, "a:1"), (1, "a:0"), (2, "b:0")]
    final.uncommitted[0] = [(0, "a:1"), (1, "a:0"), (2, "b:0"), (4, "b:1")]
    events = [e for e in events if e["op"] != "read" and not (e["op"] == "send" and e["phase"] == "ok"
                                                               and e["w"] == "a")]
    events += [send("a", "a:0", 0, 0, "ok", t=0.2), send("a", "a:1", 0, 1, "ok", t=0.4)]
    only(check(events, final), "reordering")


def test_nonmonotonic_poll():
    events, final = clean_history()
    events.append(read("r", "a:0", 0, 0, t=6.0))  # same session, offset 0 again after 2
    report = check(events, final)
    assert report.anomalies["nonmonotonic_polls"]
    events, final = clean_history()
    events.append(read("r", "a:0", 0, 0, session=1, t=6.0))  # a new session may re-read
    assert check(events, final).ok


def test_inconsistent_offset():
    events, final = clean_history()
    events.append(send("c", "c:0", 0, 0, "invoke", t=0.5))
    events.append(send("c", "c:0", 0, 0, "ok", 1, t=0.6))  # claims offset 1, which holds a:1
    report = check(events, final)
    assert report.anomalies["inconsistent_offsets"] == [{"p": 0, "offset": 1, "values": ["a:1", "c:0"]}]


def test_phantom():
    events, final = clean_history()
    events.append(read("r", "zz:9", 0, 9, session=2))
    assert check(events, final).anomalies["phantoms"]


@pytest.mark.parametrize("stuck_for, expect", [(5.0, False), (80.0, True)])
def test_hanging_transaction(stuck_for, expect):
    events, final = clean_history()
    events += [{"op": "lso", "w": "m", "p": 0, "lso": 2, "hwm": 5, "t": 10.0 + i * stuck_for / 4}
               for i in range(5)]
    events.append({"op": "lso", "w": "m", "p": 0, "lso": 6, "hwm": 6, "t": 11.0 + stuck_for})
    report = check(events, final, txn_timeout_s=60, margin_s=10)
    assert bool(report.anomalies["hanging_transactions"]) is expect
    final.lso_caught_up[0] = False
    assert check(events, final).anomalies["hanging_transactions"]


def test_every_anomaly_has_a_test():
    tested = {"lost_writes", "duplicates", "aborted_reads", "uncommitted_reads", "reordering",
              "nonmonotonic_polls", "inconsistent_offsets", "phantoms", "hanging_transactions", "lost_commits", "group_skips",
              "replica_divergence", "under_replicated"}  # the last two: test_replicas.py, test_cluster_lagging.py
    assert tested == set(ANOMALIES)


def test_copier_retry_after_abort_is_clean_but_two_commits_are_a_duplicate():
    events = [
        txn("c1", "c1-t0", "begin", 1.0), send("c1", "copy:x", 0, 0, "ok", 0, txn="c1-t0", t=1.1),
        txn("c1", "c1-t0", "abort-ok", 1.2),
        txn("c2", "c2-t0", "begin", 2.0), send("c2", "copy:x", 0, 0, "ok", 2, txn="c2-t0", t=2.1),
        txn("c2", "c2-t0", "commit-invoke", 2.2), txn("c2", "c2-t0", "commit-ok", 2.3),
    ]
    final = FinalRead(committed={0: [(2, "copy:x")]}, uncommitted={0: [(0, "copy:x"), (2, "copy:x")]},
                      log_start={0: 0})
    assert check(events, final, expected={"copy:x"}).ok
    events[2] = txn("c1", "c1-t0", "commit-ok", 1.2)
    final.committed[0].insert(0, (0, "copy:x"))
    assert check(events, final, expected={"copy:x"}).anomalies["duplicates"]


def test_expected_value_never_copied_is_lost():
    events, final = clean_history()
    only(check(events, final, expected={"copy:never"}), "lost_writes")


def test_copy_of_an_unanswered_input_is_possible_not_a_phantom():
    """A pipeline copies an input whose producer was killed before its answer: no history writes the copy."""
    events, final = clean_history()
    final.committed[0].append((50, "copy:maybe"))
    final.uncommitted[0].append((50, "copy:maybe"))
    only(check(events, final), "phantoms")
    assert check(events, final, possible={"copy:maybe"}).ok
    final.committed[0].append((51, "copy:maybe"))
    only(check(events, final, possible={"copy:maybe"}), "duplicates")


def test_acknowledged_without_an_offset():
    """librdkafka reports a DUPLICATE_SEQUENCE_NUMBER answer as delivered with no offset (None, logged as -1 or
    missing): counted as acknowledged, placed by the reads."""
    events, final = clean_history()
    for e in events:
        if e["op"] == "send" and e["v"] == "a:1" and e["phase"] == "ok":
            e["offset"] = None
    assert check(events, final).ok
    for e in events:
        if e["op"] == "send" and e["v"] == "a:1" and e["phase"] == "ok":
            e["offset"] = -1
    assert check(events, final).ok


# -- consumer groups ------------------------------------------------------------------------------------------

def group_history():
    """Member m1 reads offsets 0-1 of partition 0 and commits 2; m2 takes the partition over, starts at 2."""
    events = [
        send("a", f"a:{i}", 0, i, "invoke", t=0.1 + i / 10) for i in range(4)
    ] + [send("a", f"a:{i}", 0, i, "ok", i, t=0.15 + i / 10) for i in range(4)] + [
        {"op": "assign", "w": "m1", "group": "g", "session": "m1/1", "partitions": [0], "t": 1.0},
        read("m1", "a:0", 0, 0, session="m1/1", t=1.1) | {"group": "g"},
        read("m1", "a:1", 0, 1, session="m1/1", t=1.2) | {"group": "g"},
        {"op": "commit", "phase": "ok", "w": "m1", "group": "g", "session": "m1/1", "offsets": [[0, 2]], "t": 1.3},
        {"op": "assign", "w": "m2", "group": "g", "session": "m2/1", "partitions": [0], "t": 2.0},
        read("m2", "a:2", 0, 2, session="m2/1", t=2.1) | {"group": "g"},
        read("m2", "a:3", 0, 3, session="m2/1", t=2.2) | {"group": "g"},
        {"op": "commit", "phase": "ok", "w": "m2", "group": "g", "session": "m2/1", "offsets": [[0, 4]], "t": 2.3},
    ]
    final = FinalRead(committed={0: [(i, f"a:{i}") for i in range(4)]},
                      uncommitted={0: [(i, f"a:{i}") for i in range(4)]}, log_start={0: 0}, lso_caught_up={0: True})
    return events, final


def test_a_group_that_read_everything_it_committed_has_no_anomaly():
    events, final = group_history()
    report = check(events, final, group_committed={"g": {0: 4}})
    assert report.ok, report.anomalies
    assert report.counts["group_commits"] == 2


def test_a_session_starting_below_an_acknowledged_commit_is_a_lost_commit():
    events, final = group_history()
    events = [e for e in events if e.get("w") != "m2"] + [
        {"op": "assign", "w": "m2", "group": "g", "session": "m2/1", "partitions": [0], "t": 2.0},
        read("m2", "a:1", 0, 1, session="m2/1", t=2.1) | {"group": "g"},  # the commit of 2 was forgotten
        read("m2", "a:2", 0, 2, session="m2/1", t=2.2) | {"group": "g"},
        read("m2", "a:3", 0, 3, session="m2/1", t=2.3) | {"group": "g"},
    ]
    report = check(events, final, group_committed={"g": {0: 4}})
    only(report, "lost_commits")
    assert report.anomalies["lost_commits"] == [{"session": "m2/1", "p": 0, "first_read": 1,
                                                 "acknowledged_commit": 2}]


def test_a_commit_acknowledged_after_the_assignment_began_is_no_lost_commit():
    events, final = group_history()
    for e in events:
        if e["op"] == "commit" and e["w"] == "m1":
            e["t"] = 2.05  # m1's commit landed while m2 was joining: m2 may have read the older offset
    events += [{"op": "assign", "w": "m3", "group": "g", "session": "m3/1", "partitions": [0], "t": 2.0},
               read("m3", "a:0", 0, 0, session="m3/1", t=2.1) | {"group": "g"}]
    report = check(events, final, group_committed={"g": {0: 4}})
    assert report.ok, report.anomalies


def test_an_offset_below_the_final_commit_that_nobody_read_is_a_group_skip():
    events, final = group_history()
    events = [e for e in events if not (e["op"] == "read" and e["offset"] == 2)]
    report = check(events, final, group_committed={"g": {0: 4}})
    only(report, "group_skips")
    assert report.anomalies["group_skips"] == [{"p": 0, "offset": 2, "v": "a:2", "committed": 4}]


def test_offsets_past_the_final_commit_may_be_unread_and_other_groups_reads_do_not_count():
    events, final = group_history()
    events = [e for e in events if not (e["op"] == "read" and e["offset"] == 3)]
    assert check(events, final, group_committed={"g": {0: 3}}).ok
    events = [e | {"group": "other"} if e["op"] == "read" and e["offset"] == 1 else e for e in events]
    only(check(events, final, group_committed={"g": {0: 3}}), "group_skips")
