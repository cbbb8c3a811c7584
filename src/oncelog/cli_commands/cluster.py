"""`oncelog cluster start`: a coordination service and N brokers on loopback, in the foreground (development).

It starts ZooKeeper (`oncelog coordination`) and brokers with node ids 1..N, each its own process and data
directory under --data-dir, waits until every broker sees all the others, prints one line on stdout,

    oncelog cluster ready: bootstrap 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094

and runs until Ctrl-C or SIGTERM, which stop every broker (each does its controlled shutdown) and then ZooKeeper,
and exit 0. The data stays: the next start finds the same cluster (same ports, same chroot /oncelog). If a broker
or ZooKeeper dies on its own, the command stops the rest and exits 1 naming it. `make cluster` runs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .common import CommandError

POLL_S = 0.5


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    cluster = sub.add_parser("cluster", help="run a coordination service and N brokers on loopback (development)")
    verbs = cluster.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    start = verbs.add_parser("start", help="start them in the foreground; Ctrl-C stops them all")
    start.add_argument("--data-dir", type=Path, default=Path("./data/cluster"),
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
    start.set_defaults(handler=_start)


def _settings(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--set takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _start(args: argparse.Namespace) -> int:
    from ..cluster.coordination_service import CoordinationServiceError
    from ..cluster.zookeeper_jars import CoordinationUnavailable
    from ..embedded import ClusterProcess

    if args.brokers < 1:
        raise CommandError("--brokers must be at least 1")
    ports = [args.port + i for i in range(args.brokers)] if args.port else []
    cluster = ClusterProcess(args.data_dir, args.brokers, _settings(args.set), chroot="/oncelog",
                             coordination_port=args.coordination_port, broker_ports=ports)
    try:
        try:
            cluster.start(args.start_timeout)
        except (CoordinationUnavailable, CoordinationServiceError) as exc:
            raise CommandError(str(exc)) from None
        except RuntimeError as exc:
            raise CommandError(f"the cluster did not start: {exc}") from None
        print(f"oncelog cluster ready: bootstrap {cluster.bootstrap}", flush=True)
        print(f"  coordination {cluster.connect}, data and logs in {args.data_dir}; Ctrl-C stops everything",
              file=sys.stderr, flush=True)
        while True:
            time.sleep(POLL_S)
            dead = [n for n in cluster.brokers if n not in cluster.alive()]
            assert cluster.coordination is not None
            if dead or not cluster.coordination.alive():
                what = f"broker(s) {dead}" if dead else "ZooKeeper"
                cluster.stop()
                raise CommandError(f"{what} exited on its own; see the logs in {args.data_dir}")
    except KeyboardInterrupt:      # SIGTERM or Ctrl-C (cli_commands.run turns both into KeyboardInterrupt)
        cluster.stop()
        return 0
    finally:
        cluster.kill_all()         # a no-op after stop(); else nothing is left behind on any way out
