"""The short fault run of `make test`: two runs of the harness, one per client (confluent-kafka, oncelog's
own), each a real broker, workload processes and every nemesis mixed, must end with zero anomalies.
`make faults RUNS=N` is the long version.


Bounded: each run injects faults for FAULTS_TEST_SECONDS (default 20) and then heals; about 40-60 s each.
"""

from __future__ import annotations

import os

import pytest

from tests.faults.checker import ANOMALIES
from tests.faults.runner import NEMESES, one_run, usable_nemeses

SECONDS = float(os.environ.get("FAULTS_TEST_SECONDS", "20"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workload,seed,client", [("transactions", 11, "confluent"), ("eos-copy", 12, "oncelog")])
def test_short_fault_run_has_no_anomalies(workload, seed, client):
    nemeses = usable_nemeses(list(NEMESES))
    result = one_run(workload, nemeses, seed, SECONDS, client, None)
    assert result.faults > 0, "the nemesis injected nothing"
    assert result.operations > 0, "the workload did nothing"
    found = {name: [a for rep in result.report.values() for a in rep.anomalies[name]] for name in ANOMALIES}
    assert not any(found.values()), {name: items[:3] for name, items in found.items() if items}
