"""The Makefile's setup stamps, read with `make -n` (nothing installed): `make run` needs only the broker's
base dependencies (the dev and spark extras are about 1 GB and a minute of silence on a fresh machine), while
`make test` must still install everything, on a fresh clone (CI) as after a `make run`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry_run(target: str, venv: Path) -> str:
    """What `make TARGET` would run with its venv at `venv` (an absolute path outside the work tree)."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )
    return done.stdout


def _touch_newer_than_pyproject(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    later = max(time.time(), (ROOT / "pyproject.toml").stat().st_mtime + 1)
    os.utime(path, (later, later))


def test_run_on_a_fresh_clone_installs_only_the_base_dependencies(tmp_path):
    plan = _dry_run("run", tmp_path / "venv")
    assert "-m pip install -q -e .\n" in plan
    assert "dev" not in plan and "spark" not in plan
    # one line says what each slow step is before it starts
    assert "setup: installing oncelog and its base dependencies" in plan
    assert plan.rstrip().endswith("--listen 127.0.0.1:9092")


def test_test_on_a_fresh_clone_installs_the_extras(tmp_path):
    plan = _dry_run("test", tmp_path / "venv")
    assert "-m pip install -q -e '.[dev,spark]'" in plan


def test_test_after_run_upgrades_to_the_full_environment(tmp_path):
    venv = tmp_path / "venv"
    _touch_newer_than_pyproject(venv / ".base-stamp")
    assert "pip install" not in _dry_run("run", venv)
    assert "-m pip install -q -e '.[dev,spark]'" in _dry_run("test", venv)


def test_a_full_environment_serves_run_without_reinstalling(tmp_path):
    venv = tmp_path / "venv"
    _touch_newer_than_pyproject(venv / ".setup-stamp")
    _touch_newer_than_pyproject(venv / ".base-stamp")
    assert "pip install" not in _dry_run("run", venv)
    assert "pip install" not in _dry_run("test", venv)
