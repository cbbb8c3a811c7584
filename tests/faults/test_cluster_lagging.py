"""A cluster fault run that does not heal is an anomaly: the partitions still without a leader or their whole ISR
after the workers (tests/faults/cluster.py, `under_replicated`) land in their topic's report. Found necessary by
cluster seed 21: a follower kept out of the ISR for good passed every other check of the run."""

from __future__ import annotations

from tests.faults.checker import ANOMALIES
from tests.faults.cluster import by_topic


def test_lagging_partitions_go_under_their_topic():
    lagging = ["idem-2 leader 1 isr [1, 3]", "idem-x-0 leader -1 isr [2]", "idem-x: error 3",
               "no broker answered Metadata: TimeoutError()"]
    assert by_topic(lagging, ["idem", "idem-x"]) == {
        "idem": ["idem-2 leader 1 isr [1, 3]", "no broker answered Metadata: TimeoutError()"],
        "idem-x": ["idem-x-0 leader -1 isr [2]", "idem-x: error 3"],
    }


def test_a_healed_cluster_has_none():
    assert by_topic([], ["idem"]) == {}
    assert "under_replicated" in ANOMALIES
