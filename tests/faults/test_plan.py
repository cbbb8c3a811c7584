"""The run matrix: every workload with every client, consecutive runs alternating clients."""

from __future__ import annotations

import pytest

from tests.faults.runner import NEMESES, plan, usable_workloads


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
                        ("a", ["y"], "oncelog"), ("a", ["x"], "oncelog"), ("a", ["y"], "confluent")]
    assert runs[6:12] == runs[:6]


def test_twenty_runs_put_every_nemesis_alone_and_the_whole_matrix_meets_every_pair_once():
    workloads = ["idempotent", "transactions", "eos-copy", "spark"]
    clients = ["confluent", "oncelog"]
    runs = plan(80, workloads, list(NEMESES), clients)
    first = runs[:20]
    assert {(w, c) for w, n, c in first if len(n) > 1} == {(w, c) for w in workloads for c in clients}
    assert {n[0] for _, n, _ in first if len(n) == 1} == set(NEMESES)
    assert ("spark", ["client-kill"], "confluent") in first  # the Spark driver may be SIGKILLed
    singles = [(w, n[0], c) for w, n, c in runs if len(n) == 1]
    assert sorted(singles) == sorted((w, n, c) for w in workloads for n in NEMESES for c in clients)


def test_unknown_workload_is_refused():
    with pytest.raises(SystemExit, match="unknown workloads"):
        usable_workloads(["idempotent", "nope"])


def test_cluster_runs_cover_every_cluster_workload_with_both_clients_then_every_cluster_nemesis_alone():
    from tests.faults.runner import CLUSTER_NEMESES, CLUSTER_WORKLOADS, usable_nemeses

    assert {"idempotent", "consumer", "transactions", "eos-copy", "spark"} <= set(CLUSTER_WORKLOADS)
    mixed = 2 * len(CLUSTER_WORKLOADS)
    runs = plan(mixed + len(CLUSTER_NEMESES), list(CLUSTER_WORKLOADS), list(CLUSTER_NEMESES),
                ["confluent", "oncelog"])
    assert {(w, c) for w, n, c in runs[:mixed]} == {(w, c) for w in CLUSTER_WORKLOADS
                                                     for c in ("confluent", "oncelog")}
    assert all(n == list(CLUSTER_NEMESES) for _, n, _ in runs[:mixed])
    assert {n[0] for _, n, _ in runs[mixed:]} == set(CLUSTER_NEMESES)
    assert usable_nemeses(list(CLUSTER_NEMESES), CLUSTER_NEMESES) == list(CLUSTER_NEMESES)
    with pytest.raises(SystemExit, match="unknown nemeses"):
        usable_nemeses(["disk-full"], CLUSTER_NEMESES)
