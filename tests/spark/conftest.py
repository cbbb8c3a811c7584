"""Fixtures of the Spark tests: one SparkSession (and JVM) per test module, `local[2]`."""

from __future__ import annotations

import pytest

from tests.spark.session import start_session, stop_session


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """The module's SparkSession; modules that need JVM settings of their own define their own fixture."""
    session = start_session(tmp_path_factory.mktemp("spark"))
    yield session
    stop_session(session)
