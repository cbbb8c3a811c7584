"""`oncelog cluster start`: a coordination service and N brokers on loopback, in the foreground (development).

It starts ZooKeeper (`oncelog coordination`) and brokers with node ids 1..N, each its own process and data
directory under --data-dir, waits until every broker sees all the others, prints one line on stdout,

    oncelog cluster ready: bootstrap 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094

and runs until Ctrl-C, SIGINT or SIGTERM (taken even when the command was started with SIGINT ignored, as a
background job of a script is: interrupts.py), then exits 0. The data stays: the next start finds the same
cluster (same ports, same chroot /oncelog). Paths are made absolute where they are taken, so a relative
--data-dir (make cluster's ./data/cluster) means the directory the command was started in.

It is a supervisor, so that a failover can be watched on it: a broker that dies (a crash, `kill -9`) is
reported in one line on stderr (which broker, its pid, its exit code or signal, where its log is) while the
others serve on, and is started again on its port and data after a backoff: 1 s, doubled after each death up
to 30 s, and back to 1 s once it has stayed up for 60 s (a broker that dies at once is not restarted in a tight
loop). A line says when it is back (registered again). ZooKeeper is treated the same way: its death is
reported and it is started again on its port and data (the brokers' sessions survive a short outage, their
metadata is on disk), because stopping every broker over it would end the very failover being watched; a
ZooKeeper that keeps dying is retried at the backoff's slowest.

Stopping moves leaderships away broker by broker: the brokers run in process groups of their own (a Ctrl-C at
the terminal reaches only this command), and are stopped one at a time, each with its controlled shutdown, by
node id with the active controller last, then ZooKeeper. A second Ctrl-C kills whatever is left. `make
cluster` runs this command.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .common import CommandError, absolute_path

POLL_S = 0.5
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 60.0       # up this long, and the next death is restarted after BACKOFF_FIRST_S again


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    cluster = sub.add_parser("cluster", help="run a coordination service and N brokers on loopback (development)")
    verbs = cluster.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    start = verbs.add_parser("start", help="start them in the foreground; Ctrl-C stops them all")
    start.add_argument("--data-dir", type=absolute_path, default="./data/cluster",
                       help="ZooKeeper's and every broker's data, and their logs (default ./data/cluster)")
    start.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    start.add_argument("--port", type=int, default=9092,
                       help="first broker's port; broker N listens on PORT+N-1 (default 9092; 0: any free ports)")
    start.add_argument("--coordination-port", type=int, default=2181,
                       help="ZooKeeper's client port (default 2181; 0: any free port)")
    start.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a broker config key for every broker (Kafka's names)")
    start.add_argument("--start-timeout", type=float, default=180.0, metavar="SECONDS",
                       help="give up if the cluster is not up within this long (default 180)")
    start.set_defaults(handler=_start, service=True)  # SIGINT stops it even when started ignored (interrupts.py)


def _settings(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--set takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _say(message: str) -> None:
    print(f"oncelog cluster: {message}", file=sys.stderr, flush=True)


def exit_status(code: int | None) -> str:
    """"exit code 1", "killed by SIGKILL": how a process ended, from Popen's returncode."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervised:
    """One child the supervisor restarts: a broker or ZooKeeper. Subclasses say how to run it.

    States: up (running and was ready), down (dead, restart due at `restart_at`), starting (launched from the
    main thread, so that a parent-death signal is tied to it; readiness awaited on a thread of its own, the
    main thread keeps watching the others)."""

    name = ""

    def __init__(self) -> None:
        self.state = "up"
        self.up_since = time.monotonic()
        self.backoff = BACKOFF_FIRST_S
        self.restart_at = 0.0
        self.down_since = 0.0
        self._ready: threading.Thread | None = None
        self._failure: str | None = None

    # what a subclass provides
    @property
    def log_path(self) -> Path:
        raise NotImplementedError

    def pid(self) -> int | None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def reap(self) -> int | None:
        raise NotImplementedError

    def launch(self) -> None:
        raise NotImplementedError

    def wait_ready(self, timeout: float) -> None:
        raise NotImplementedError

    # the supervisor's side
    def tick(self, now: float, start_timeout: float) -> None:
        if self.state == "up" and not self.alive():
            pid = self.pid()
            status = exit_status(self.reap())
            self._schedule(now, f"{self.name} (pid {pid}) died ({status}); log {self.log_path}")
        elif self.state == "down" and now >= self.restart_at:
            try:
                self.launch()
            except Exception as exc:  # noqa: BLE001 - e.g. the port taken meanwhile: reported, tried again
                self._schedule(now, f"{self.name} could not be started again ({exc})")
                return
            self.state = "starting"
            self._failure = None
            self._ready = threading.Thread(target=self._await_ready, args=(start_timeout,), daemon=True,
                                           name=f"ready-{self.name}")
            self._ready.start()
        elif self.state == "starting" and self._ready is not None and not self._ready.is_alive():
            self._ready = None
            if self._failure is None:
                self.state, self.up_since = "up", now
                _say(f"{self.name} is back (pid {self.pid()}) after {now - self.down_since:.1f} s")
            else:
                self.reap()
                self._schedule(now, f"{self.name} did not come back ({self._failure}); log {self.log_path}")

    def _schedule(self, now: float, what: str) -> None:
        if self.state == "up":
            self.down_since = now
            if now - self.up_since >= STABLE_S:
                self.backoff = BACKOFF_FIRST_S
        delay = self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX_S)
        self.state, self.restart_at = "down", now + delay
        _say(f"{what}; restarting it in {delay:.0f} s")

    def _await_ready(self, timeout: float) -> None:
        try:
            self.wait_ready(timeout)
        except Exception as exc:  # noqa: BLE001 - any failure to come up is reported by the main thread
            self._failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class SupervisedBroker(Supervised):
    def __init__(self, cluster: Any, node_id: int) -> None:
        super().__init__()
        self.cluster = cluster
        self.node_id = node_id
        self.broker = cluster.brokers[node_id]
        self.name = f"broker {node_id}"

    @property
    def log_path(self) -> Path:
        return self.broker.log_path

    def pid(self) -> int | None:
        return self.broker.pid

    def alive(self) -> bool:
        return self.broker.alive()

    def reap(self) -> int | None:
        return self.broker.reap()

    def launch(self) -> None:
        self.broker.launch()

    def wait_ready(self, timeout: float) -> None:
        # "listening" is printed once the broker has registered again (after a SIGKILL: once the controller's
        # crash probe or the old session's end removed the previous registration).
        self.broker.wait_ready(timeout)


class SupervisedZooKeeper(Supervised):
    name = "ZooKeeper"

    def __init__(self, service: Any) -> None:
        super().__init__()
        self.member = service.member

    @property
    def log_path(self) -> Path:
        return self.member.log_path

    def pid(self) -> int | None:
        return self.member.pid

    def alive(self) -> bool:
        return self.member.alive()

    def reap(self) -> int | None:
        return self.member.wait() if self.member.proc is not None else self.member.returncode

    def launch(self) -> None:
        self.member.launch()      # the same zoo.cfg: same port, same data

    def wait_ready(self, timeout: float) -> None:
        try:
            self.member.wait_serving(timeout)
        except BaseException:
            self.member.kill()
            raise


def _start(args: argparse.Namespace) -> int:
    from ..cluster.coordination_service import CoordinationServiceError
    from ..cluster.zookeeper_jars import CoordinationUnavailable
    from ..embedded import ClusterProcess

    if args.brokers < 1:
        raise CommandError("--brokers must be at least 1")
    ports = [args.port + i for i in range(args.brokers)] if args.port else []
    cluster = ClusterProcess(args.data_dir, args.brokers, _settings(args.set), chroot="/oncelog",
                             coordination_port=args.coordination_port, broker_ports=ports,
                             own_process_groups=True)
    try:
        try:
            cluster.start(args.start_timeout)
        except (CoordinationUnavailable, CoordinationServiceError) as exc:
            raise CommandError(str(exc)) from None
        except RuntimeError as exc:
            raise CommandError(f"the cluster did not start: {exc}") from None
        assert cluster.coordination is not None
        print(f"oncelog cluster ready: bootstrap {cluster.bootstrap}", flush=True)
        pids = ", ".join(f"{n} (pid {b.pid})" for n, b in cluster.brokers.items())
        _say(f"coordination {cluster.connect} (pid {cluster.coordination.pid}), brokers {pids}; data and logs "
             f"in {args.data_dir}; a broker that dies is restarted; Ctrl-C stops everything")
        children: list[Supervised] = [SupervisedZooKeeper(cluster.coordination)]
        children += [SupervisedBroker(cluster, n) for n in cluster.brokers]
        while True:
            time.sleep(POLL_S)
            now = time.monotonic()
            for child in children:
                child.tick(now, args.start_timeout)
    except KeyboardInterrupt:      # SIGTERM or Ctrl-C (cli_commands.run turns both into KeyboardInterrupt)
        started = time.monotonic()
        order = cluster.stop_order()
        _say(f"stopping brokers {', '.join(map(str, order))} one at a time, then ZooKeeper")
        cluster.stop(order=order)
        _say(f"stopped in {time.monotonic() - started:.1f} s")
        return 0
    finally:
        cluster.kill_all()         # a no-op after stop(); else nothing is left behind on any way out
