"""`oncelog coordination start|classpath|scram-credential`: the coordination service (ZooKeeper) cluster mode keeps
metadata on.

`start` runs one ZooKeeper member in the foreground, for development and tests: it prints exactly one line on
stdout, `oncelog coordination ready at HOST:PORT` (the connect string brokers take in
`oncelog.coordination.connect`), once a session to it opens; SIGTERM or Ctrl-C stop the JVM (SIGTERM, SIGKILL
after a bound) and exit 0, SIGINT also when the command was started with it ignored (a background job of a
script; interrupts.py). --data-dir is made absolute against the directory the command runs in: the JVM runs in
its data directory. If the JVM dies on its own the command exits 1 with the end of its log. The JVM dies
with this process in every case (oncelog.cluster.coordination_service). `classpath` resolves ZooKeeper's jars
(Maven, first use only) and prints the classpath: `make coordination-setup` runs it so tests need no Maven.
Needs `java` (and `mvn` until the jars are cached); without them, a one-line error.

`scram-credential` creates or replaces a user's SCRAM credential in a cluster's ZooKeeper, with no broker running
(Kafka's `kafka-configs --zookeeper HOST:PORT --alter --add-config 'SCRAM-SHA-512=[password=...]' --entity-type
users --entity-name broker`): brokers that authenticate to each other with SCRAM
(sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512) need their own user's credential before they can replicate.
--connect is the brokers' oncelog.coordination.connect (chroot included; without one, their default /oncelog). The
password is read from --password-file (`-`: standard input) or taken from --password; only the salted credential
is stored. Brokers running already take the change at once; once a cluster runs, AlterUserScramCredentials
(`kafka-configs --bootstrap-server ... --alter --add-config 'SCRAM-SHA-256=[password=...]'`) does the same.
With --config (the brokers' server.properties) it logs in to ZooKeeper as the brokers do and creates what it
creates with their ACLs (`zookeeper.set.acl`, the JAAS file of `java.security.auth.login.config` or KAFKA_OPTS;
docs/security.md §9); --connect then defaults to the file's oncelog.coordination.connect.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from .common import CommandError, absolute_path


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    coordination = sub.add_parser("coordination",
                                  help="run the coordination service (ZooKeeper) cluster mode keeps metadata on")
    verbs = coordination.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    start = verbs.add_parser("start", help="run one ZooKeeper member in the foreground (development, tests)")
    start.add_argument("--data-dir", type=absolute_path, required=True,
                       help="ZooKeeper's data (znodes survive restarts), zoo.cfg and zookeeper.log")
    start.add_argument("--listen", type=_host_port, default=("127.0.0.1", 2181), metavar="HOST:PORT",
                       help="client address (default 127.0.0.1:2181; port 0: any free port)")
    start.add_argument("--start-timeout", type=float, default=120.0, metavar="SECONDS",
                       help="give up if it does not answer within this long (default 120; the jars' first "
                            "download from Maven Central is not counted)")
    start.add_argument("--heap-mb", type=int, default=128, help="JVM heap (default 128)")
    start.set_defaults(handler=_start, service=True)  # SIGINT stops it even when started ignored (interrupts.py)

    classpath = verbs.add_parser("classpath", help="resolve ZooKeeper's jars (Maven, first use only) and print "
                                                   "the classpath")
    classpath.set_defaults(handler=_classpath)

    scram = verbs.add_parser("scram-credential", help="create or replace a user's SCRAM credential in a cluster's "
                                                      "ZooKeeper, before its brokers run")
    scram.add_argument("--connect", metavar="HOST:PORT[/CHROOT]",
                       help="the brokers' oncelog.coordination.connect (default: the --config file's)")
    scram.add_argument("--config", metavar="FILE",
                       help="the brokers' server.properties: their ZooKeeper login and znode ACLs "
                            "(zookeeper.set.acl, java.security.auth.login.config)")
    scram.add_argument("--user", required=True, help="the user name (the principal is User:<name>)")
    scram.add_argument("--mechanism", default="SCRAM-SHA-512", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"),
                       type=str.upper, help="default SCRAM-SHA-512")
    secret = scram.add_mutually_exclusive_group(required=True)
    secret.add_argument("--password-file", metavar="FILE", help="a file whose first line is the password; - reads "
                                                                "standard input")
    secret.add_argument("--password", help="the password itself (visible to other users of this machine)")
    scram.add_argument("--iterations", type=int, default=4096, help="4096 to 16384 (default 4096)")
    scram.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                       help="give up if ZooKeeper does not answer within this long (default 30)")
    scram.set_defaults(handler=_scram_credential)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _scram_credential(args: argparse.Namespace) -> int:
    from ..security.credentials import MAX_ITERATIONS, MIN_ITERATIONS, from_password

    if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
        raise CommandError(f"--iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}")
    if args.password_file is not None:
        try:
            if args.password_file == "-":
                text = sys.stdin.readline()
            else:
                with open(args.password_file, encoding="utf-8") as handle:
                    text = handle.readline()
        except OSError as exc:
            raise CommandError(f"--password-file {args.password_file}: {exc}") from None
        password = text.rstrip("\r\n")
    else:
        password = args.password
    if not password:
        raise CommandError("the password is empty")
    connect, security = _zookeeper_of(args)
    from ..cluster.store.credentials import put_credential
    from ..cluster.store.errors import NotStored

    try:
        put_credential(connect, args.user, from_password(args.mechanism, password, args.iterations),
                       args.timeout, security)
    except NotStored as exc:
        raise CommandError(str(exc)) from None
    print(f"oncelog coordination: {args.mechanism} credential of {args.user} stored ({args.iterations} iterations)",
          flush=True)
    return 0


def _zookeeper_of(args: argparse.Namespace) -> tuple[str, Any]:
    """The connect string and ZooKeeper security (store/znode_acls.py) of --connect and --config."""
    import os

    from ..cluster.store.errors import ZkAuthError
    from ..cluster.store.znode_acls import KEYS, OPEN, zk_security
    from ..config import ConfigError, load_broker_config

    if args.config is None:
        if not args.connect:
            raise CommandError("--connect or --config is needed")
        return args.connect, OPEN
    try:
        with open(args.config, encoding="utf-8") as handle:
            # --connect stands for the file's connect string (a file without one is still a cluster's)
            overrides = [f"oncelog.coordination.connect={args.connect}"] if args.connect else []
            config = load_broker_config(handle.read(), overrides, strict=False)
    except OSError as exc:
        raise CommandError(f"--config {args.config}: {exc.strerror or exc}") from None
    except ConfigError as exc:
        raise CommandError(f"--config {args.config}: {exc}") from None
    connect = args.connect or config["oncelog.coordination.connect"]
    if not connect:
        raise CommandError(f"--config {args.config} has no oncelog.coordination.connect: give --connect")
    try:
        security = zk_security({k: config[k] for k in KEYS if k in config.explicit}, os.environ)
    except ZkAuthError as exc:
        raise CommandError(str(exc)) from None
    return connect, security


def _classpath(args: argparse.Namespace) -> int:
    from ..cluster.zookeeper_jars import CoordinationUnavailable, zookeeper_classpath

    try:
        print(zookeeper_classpath())
    except (CoordinationUnavailable, RuntimeError) as exc:
        raise CommandError(str(exc)) from None
    return 0


def _start(args: argparse.Namespace) -> int:
    from ..cluster.coordination_service import CoordinationService, CoordinationServiceError
    from ..cluster.zookeeper_jars import (
        CoordinationUnavailable,
        cached_classpath,
        java_executable,
        zookeeper_classpath,
    )

    host, port = args.listen
    service = CoordinationService(args.data_dir, host, port, heap_mb=args.heap_mb)
    try:
        try:
            service.java = java_executable()
            if cached_classpath() is None and shutil.which("mvn"):
                print("oncelog: resolving ZooKeeper's jars with Maven (first use only)", file=sys.stderr,
                      flush=True)
            service.classpath = zookeeper_classpath()
            service.start(args.start_timeout)
        except (CoordinationUnavailable, CoordinationServiceError) as exc:
            raise CommandError(str(exc)) from None
        except (OSError, RuntimeError) as exc:
            raise CommandError(f"cannot start the coordination service on {host}:{port}: {exc}") from None
        pid = service.pid
        print(f"oncelog coordination ready at {service.servers}", flush=True)
        code = service.wait()
        raise CommandError(f"ZooKeeper (pid {pid}) exited on its own with code {code}; "
                           f"the end of its log:\n{service.log_tail()}")
    except KeyboardInterrupt:       # SIGTERM or Ctrl-C (cli_commands.run turns both into KeyboardInterrupt)
        service.stop()
        return 0
    finally:
        service.kill()              # a no-op after stop(); else no JVM is left behind on any way out
