"""Shared fixtures: real brokers on loopback with temp data dirs."""

from __future__ import annotations

import itertools
import shutil

import pytest

from tests.support.broker import BrokerProcess

_names = itertools.count()


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory):
    """One broker for a test module; tests use their own topics."""
    proc = BrokerProcess(tmp_path_factory.mktemp("broker") / "data").start()
    yield proc
    if proc.alive():
        proc.stop()


@pytest.fixture
def broker_factory(tmp_path):
    """Brokers of one test, with settings; stopped at the end."""
    started: list[BrokerProcess] = []

    def make(settings: dict | None = None, metrics: bool = False, name: str = "data") -> BrokerProcess:
        proc = BrokerProcess(tmp_path / name, settings, metrics=metrics).start()
        started.append(proc)
        return proc

    yield make
    for proc in started:
        if proc.alive():
            proc.stop()


@pytest.fixture
def topic_name(request):
    """A topic name unique within the session."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60]
    return f"t-{base}-{next(_names)}"


def kcat_path() -> str | None:
    return shutil.which("kcat") or shutil.which("kafkacat")
