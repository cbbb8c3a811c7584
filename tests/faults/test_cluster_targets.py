"""The cluster nemesis strikes a workload's coordinators by name: the transaction coordinator is the leader of
the __transaction_state partition of the workload's transactional ids, which tests/faults/cluster.py derives
from the worker processes' names the way tests/faults/workers.py builds them. If the two drift apart the
nemesis silently strikes some other broker; this test starts the real workers against one broker (the
single-node run, no ZooKeeper needed) and asks the broker which transactional ids and groups they use.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from oncelog.client.admin import Admin
from tests.faults.cluster import consumer_groups, transactional_ids
from tests.faults.runner import Run

SEEN_WITHIN_S = 60.0  # the workers' interpreters start and init their producers on a loaded machine


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workload,txn_ids,groups", [
    ("transactions", ["fault-txn-a", "fault-txn-b"], []),
    ("eos-copy", ["fault-copier-0"], ["fault-copy"]),
])
def test_coordinator_targets_name_the_ids_the_workers_use(tmp_path: Path, workload, txn_ids, groups):
    run = Run(workload, [], seed=5, seconds=30, client="oncelog", workdir=tmp_path / "run")
    try:
        run.start()
        predicted = sorted(transactional_ids(run.workers, run._incarnation))
        assert predicted == txn_ids
        assert consumer_groups(run.workers) == groups
        deadline = time.monotonic() + SEEN_WITHIN_S
        with Admin({"bootstrap.servers": run.read_bootstrap}, api_timeout=20) as admin:
            listed: list[str] = []
            while time.monotonic() < deadline:
                listed = sorted(t.transactional_id for t in admin.list_transactions())
                if listed == predicted:
                    break
                time.sleep(0.5)
        assert listed == predicted
        ck = AdminClient({"bootstrap.servers": run.read_bootstrap})
        joined: set[str] = set()
        while groups and time.monotonic() < deadline:
            joined = {g.group_id for g in ck.list_consumer_groups().result(20).valid}
            if set(consumer_groups(run.workers)) <= joined:
                break
            time.sleep(0.5)
        assert set(consumer_groups(run.workers)) <= joined
    finally:
        run.stop()
