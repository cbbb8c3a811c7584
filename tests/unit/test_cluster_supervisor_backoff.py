"""`oncelog cluster start`'s restart backoff (cli_commands/cluster.py Supervised), on a stand-in child and a clock
the test moves: 1 s after the first death, doubled after each death to 30 s, and 1 s again once the child stayed
up STABLE_S; a start that fails counts as a death. The process-level behaviour is tests/cluster/test_dev_cluster.py.
"""

from __future__ import annotations

from pathlib import Path

from oncelog.cli_commands import cluster
from oncelog.cli_commands.cluster import BACKOFF_MAX_S, STABLE_S, Supervised


class Child(Supervised):
    name = "broker 9"

    def __init__(self) -> None:
        super().__init__()
        self.running = True
        self.fail_start = False
        self.launches = 0

    @property
    def log_path(self) -> Path:
        return Path("/nowhere/broker-9-broker.log")

    def pid(self) -> int | None:
        return 4242

    def alive(self) -> bool:
        return self.running

    def reap(self) -> int | None:
        return -9

    def launch(self) -> None:
        self.launches += 1
        self.running = True

    def wait_ready(self, timeout: float) -> None:
        if self.fail_start:
            self.running = False
            raise RuntimeError("broker exited during startup (code 1)")


def _tick(child: Child, now: float) -> None:
    child.tick(now, 10.0)
    if child._ready is not None:        # readiness runs on a thread: let it finish before the next tick
        child._ready.join()


def _die_and_return(child: Child, now: float) -> float:
    """Kill the child at `now`; the delay before its restart."""
    child.running = False
    _tick(child, now)
    assert child.state == "down"
    delay = child.restart_at - now
    _tick(child, child.restart_at)        # launched
    _tick(child, child.restart_at)        # seen ready
    assert child.state == "up"
    return delay


def test_backoff_doubles_to_its_bound_and_resets_after_a_stable_run(capsys):
    child = Child()
    now = 1000.0
    delays = []
    for _ in range(7):
        delays.append(_die_and_return(child, now))
        now = child.restart_at + 1.0        # dies again a second after it came back
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_MAX_S, BACKOFF_MAX_S]
    assert _die_and_return(child, child.up_since + STABLE_S) == 1.0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("oncelog cluster: broker 9 (pid 4242) died (killed by SIGKILL); "
                      "log /nowhere/broker-9-broker.log; restarting it in 1 s")
    assert err[1] == "oncelog cluster: broker 9 is back (pid 4242) after 1.0 s"


def test_a_failed_start_is_reported_and_tried_again_later(capsys):
    child = Child()
    child.running = False
    _tick(child, 0.0)
    child.fail_start = True
    _tick(child, child.restart_at)
    _tick(child, child.restart_at)
    assert child.state == "down" and child.restart_at == 1.0 + 2.0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "oncelog cluster: broker 9 did not come back (broker exited during startup (code 1)); "
        "log /nowhere/broker-9-broker.log; restarting it in 2 s")
    child.fail_start = False
    _tick(child, child.restart_at)
    _tick(child, child.restart_at)
    assert child.state == "up" and child.launches == 2


def test_exit_status_names_the_signal():
    assert cluster.exit_status(-9) == "killed by SIGKILL"
    assert cluster.exit_status(1) == "exit code 1"
