"""The run matrix: every workload with every client, consecutive runs alternating clients."""

from __future__ import annotations

import pytest

from tests.faults.runner import plan, usable_workloads


def test_eight_runs_cover_four_workloads_with_both_clients_under_the_mix():
    runs = plan(8, ["idempotent", "transactions", "eos-copy", "spark"], ["broker-kill", "client-kill"],
                ["confluent", "oncelog"])
    assert {(w, c) for w, _, c in runs} == {(w, c) for w in ("idempotent", "transactions", "eos-copy", "spark")
                                              for c in ("confluent", "oncelog")}
    assert all(n == ["broker-kill", "client-kill"] for _, n, _ in runs)
    assert [c for _, _, c in runs[:4]] == ["confluent", "oncelog", "confluent", "oncelog"]


def test_single_nemesis_cells_follow_and_the_plan_wraps_around():
    runs = plan(14, ["a"], ["x", "y"], ["confluent", "oncelog"])
    assert runs[:6] == [("a", ["x", "y"], "confluent"), ("a", ["x", "y"], "oncelog"), ("a", ["x"], "confluent"),
                        ("a", ["x"], "oncelog"), ("a", ["y"], "confluent"), ("a", ["y"], "oncelog")]
    assert runs[6:12] == runs[:6]


def test_unknown_workload_is_refused():
    with pytest.raises(SystemExit, match="unknown workloads"):
        usable_workloads(["idempotent", "nope"])
