"""Fixtures of the Spark tests: one SparkSession (and JVM) per test module, `local[2]`."""

from __future__ import annotations

import importlib.util

import pytest

from tests.spark.session import start_session, stop_session

if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
    # The modules import pyspark/pyarrow at the top; without the `spark` extra they are not collected at all,
    # and the session header says why.
    collect_ignore_glob = ["test_*.py"]

    def pytest_report_header(config):
        return "tests/spark not collected: the `spark` extra is not installed (pip install -e '.[dev,spark]')"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """The module's SparkSession; modules that need JVM settings of their own define their own fixture."""
    session = start_session(tmp_path_factory.mktemp("spark"))
    yield session
    stop_session(session)
