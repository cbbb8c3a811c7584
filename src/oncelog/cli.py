"""The `oncelog` command. `serve` runs a broker in the foreground; the client commands (topics, records,
producers, transactions, groups, produce, consume) live in `cli_commands/`, one module per family.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from . import cli_commands
from .cli_commands.common import absolute_path
from .config import ConfigError, load_broker_config
from .security.listeners import ListenerError, listener_specs
from .storage.dir_lock import lock_data_dir


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oncelog",
        description="A Kafka-protocol broker with exactly-once producers (serve), and a client for it.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one broker in the foreground")
    serve.add_argument("--data-dir", type=absolute_path, default="./data",
                       help="where partition logs live (default ./data)")
    serve.add_argument("--listen", type=_host_port, default=None,
                       help="HOST:PORT of one PLAINTEXT listener (port 0: any free; default 127.0.0.1:9092); "
                            "with `listeners` in the config file, leave it out")
    serve.add_argument("--config", type=absolute_path, help="a server.properties file with Kafka's key names")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    serve.add_argument("--metrics-listen", type=_host_port, help="HOST:PORT for Prometheus metrics")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    cli_commands.register(sub)
    return parser


async def _serve(args: argparse.Namespace) -> int:
    from .broker.server import Broker, StartError

    config = args.broker_config
    host, port = args.listen or ("127.0.0.1", 9092)
    try:
        broker = Broker(config, args.data_dir, host, port, metrics_listen=args.metrics_listen,
                        listen_socket=args.listen_sockets[0], bound_sockets=args.listen_sockets)
    except StartError as exc:
        print(f"oncelog: cannot start: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A cluster-mode start may wait for the coordination service: a signal meanwhile ends it cleanly.
    starting = loop.create_task(broker.start())
    stopping = loop.create_task(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await broker.stop()
        return 0
    try:
        starting.result()
    except StartError as exc:
        stopping.cancel()
        print(f"oncelog: cannot start: {exc}", file=sys.stderr, flush=True)
        return 1
    if config["listeners"]:
        # every named listener first, so a supervisor has them all when it reads the "listening" line
        for listener in broker.security.listeners:
            print(f"oncelog listener {listener.name} ({listener.spec.protocol}) on "
                  f"{listener.spec.host}:{listener.port}", flush=True)
    print(f"oncelog listening on {broker.host}:{broker.port}", flush=True)
    if broker.metrics_port is not None:
        print(f"oncelog metrics on {args.metrics_listen[0]}:{broker.metrics_port}", flush=True)
    failing = loop.create_task(broker.fatal.wait())
    await asyncio.wait([stopping, failing], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    failing.cancel()
    await broker.stop()
    if broker.fatal.is_set():
        print(f"oncelog: stopped: {broker.fatal_reason}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        logging.basicConfig(
            level=getattr(logging, str(args.log_level).upper(), logging.INFO),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        from .broker.server import StartError, bind_listener

        try:
            lock = lock_data_dir(Path(args.data_dir))
        except OSError as exc:
            print(f"oncelog: cannot start: {exc}", file=sys.stderr)
            return 1
        try:
            text = args.config.read_text() if args.config else None
            args.broker_config = load_broker_config(text, args.set)
            specs = listener_specs(args.broker_config.values, args.listen or ("127.0.0.1", 9092)
                                   if not args.broker_config["listeners"] or args.listen else None)
        except (ConfigError, ListenerError) as exc:
            os.close(lock)
            print(f"oncelog: configuration error: {exc}", file=sys.stderr)
            return 2
        # The ports before any log is loaded: one taken, the start ends here (see bind_listener).
        args.listen_sockets = []
        try:
            for spec in specs:
                args.listen_sockets.append(bind_listener(spec.host, spec.port))
        except StartError as exc:
            for sock in args.listen_sockets:
                sock.close()
            os.close(lock)
            print(f"oncelog: cannot start: {exc}", file=sys.stderr)
            return 1
        try:
            return asyncio.run(_serve(args))
        except ConfigError as exc:
            print(f"oncelog: configuration error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"oncelog: cannot start: {exc}", file=sys.stderr)
            return 1
        finally:
            for sock in args.listen_sockets:
                sock.close()
            os.close(lock)
    return cli_commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
