"""`make demo` end to end, shortened: the pipeline (two streaming stages through the exactly-once sink, the
repartition topic purged with DeleteRecords) must end with an exactly-once verdict and exit status 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.session import require_spark

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # about 33 s; the sink's own tests (test_sink.py) stay in make test
def test_demo_prints_an_exactly_once_verdict():
    require_spark()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-m", "oncelog.spark.demo", "--seconds", "6", "--rate", "1000"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert "EXACTLY ONCE: yes" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["duplicates"].split()[-1] == "0" and lines["losses"].split()[-1] == "0"
    assert "stage 2:" in out and "purged below" in out  # progress was shown while it ran
