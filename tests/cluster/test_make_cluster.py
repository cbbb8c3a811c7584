"""`make cluster` the way a new user runs it: in a fresh clone, with the Makefile's default relative data directory
(./data/cluster), until the ready line; then one record through it with a real client, and SIGINT.

The clone reuses the environment this test runs in (VENV=<its prefix>) instead of installing a gigabyte again,
so its `oncelog` is that environment's. The setup target must then not run: it would `pip install -e .` the
clone into the shared environment (the clone's pyproject.toml is newer than the stamp) and re-point everybody's
editable install at a directory this test deletes. `make -o <stamp>` treats the stamps as up to date, and a dry
run first makes sure nothing else on the way installs anything: if one would, the test fails before running it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.dev_cluster import WAIT_S, Lines, kill_quietly, round_trip, wait_gone

ROOT = Path(__file__).resolve().parents[2]
INSTALLS = re.compile(r"pip install|-m venv|\bvirtualenv\b")
STAMPS = (".setup-stamp", ".base-stamp")   # the Makefile's install stamps in $(VENV), taken as up to date


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _cluster_command(make_pid: int) -> int:
    """The `oncelog cluster start` process make runs (directly, or under the shell make may use)."""
    todo = [make_pid]
    while todo:
        pid = todo.pop()
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cluster" in argv and b"start" in argv and any(a.endswith(b"oncelog") for a in argv):
            return pid
        todo += _children(pid)
    raise AssertionError(f"no `oncelog cluster start` under make (pid {make_pid})")


@pytest.fixture
def clone(tmp_path) -> Path:
    if shutil.which("make") is None or shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs make, git and a git checkout to clone")
    target = tmp_path / "oncelog"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True, timeout=WAIT_S)
    return target


def test_make_cluster_from_a_fresh_clone(clone, zookeeper_runtime):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "oncelog").exists():
        pytest.skip(f"not running in the project's environment ({venv} has no bin/oncelog)")
    keep = [arg for stamp in STAMPS for arg in ("-o", str(venv / stamp))]
    make = ["make", "--no-print-directory", *keep, "cluster", f"VENV={venv}", "CLUSTER_PORT=0",
            "CLUSTER_COORDINATION_PORT=0"]
    dry = subprocess.run([*make[:1], "-n", *make[1:]], cwd=clone, capture_output=True, text=True, timeout=WAIT_S)
    assert dry.returncode == 0, dry.stderr
    assert not INSTALLS.search(dry.stdout), f"make cluster would install into {venv}:\n{dry.stdout}"

    proc = subprocess.Popen(make, cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        try:
            bootstrap = out.expect(r"^oncelog cluster ready: bootstrap (\S+)$").group(1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; stderr: {err.rest()}") from None
        assert len(bootstrap.split(",")) == 3
        assert (clone / "data" / "cluster" / "coordination" / "zoo.cfg").is_file()
        round_trip(bootstrap, replication=3)
        os.kill(_cluster_command(proc.pid), signal.SIGINT)
        try:
            code = proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"make cluster still running {WAIT_S:.0f} s after SIGINT; {err.seen}") from None
        assert code == 0, err.rest()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_quietly(proc, clone)
    wait_gone(clone)
