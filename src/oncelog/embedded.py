"""Run real oncelog brokers as subprocesses: for tests, benchmarks and pipelines that embed one.

A broker listens on an ephemeral port (`--listen 127.0.0.1:0`) and announces the port
on stdout; a restart reuses that port so clients reconnect to the same address.

`ClusterProcess` (`start_cluster`) runs a cluster on loopback: a coordination service (ZooKeeper, a child JVM;
needs java and its jars, see `oncelog coordination classpath`) and n brokers with node ids 1..n, each its own
process and data directory, joined through the coordination service.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class BrokerProcess:
    """One `oncelog serve` child. With `own_group` it runs in a process group (and session) of its own and dies
    with the thread that launched it when that is the main thread (see coordination_service.orphan_guard): a
    Ctrl-C at the terminal then reaches only the parent, which stops its brokers one at a time (`oncelog
    cluster start`), instead of every broker at once."""

    def __init__(self, data_dir: str | Path, settings: dict[str, object] | None = None,
                 metrics: bool = False, own_group: bool = False) -> None:
        # Absolute: it is handed to a child process and printed, and must mean the same directory to both
        # whatever the working directory of either.
        self.data_dir = Path(os.path.abspath(data_dir))
        self.settings = dict(settings or {})
        self.metrics = metrics
        self.own_group = own_group
        self.port = 0
        self.metrics_port = 0
        # With `listeners` in the settings: each listener's bound port by name (a restart binds them again).
        self.listener_ports: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting for it to listen (`wait_ready` does): brokers of a cluster start
        side by side."""
        from .cluster.coordination_service import orphan_guard

        guard = orphan_guard() if self.own_group else []
        args = [*guard, sys.executable, "-m", "oncelog", "serve", "--data-dir", str(self.data_dir)]
        settings = dict(self.settings)
        if "listeners" in settings:
            settings["listeners"] = self._listeners_with_ports(str(settings["listeners"]))
        else:
            args += ["--listen", f"127.0.0.1:{self.port}"]
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        if self.metrics:
            args += ["--metrics-listen", f"127.0.0.1:{self.metrics_port}"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log_file, text=True,
                                     start_new_session=self.own_group)
        log_file.close()

    def _listeners_with_ports(self, text: str) -> str:
        """`listeners` with the ports bound by the last run in place of 0, so a restart keeps its addresses."""
        out = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, address = item.partition("://")
            host, _, port = address.rpartition(":")
            port = str(self.listener_ports.get(name.upper(), port)) if port == "0" else port
            out.append(f"{name}://{host}:{port}")
        return ",".join(out)

    def listener(self, name: str) -> str:
        """host:port of the listener `name` (settings with `listeners` only)."""
        return f"127.0.0.1:{self.listener_ports[name.upper()]}"

    def wait_ready(self, timeout: float = 30.0) -> BrokerProcess:
        """Wait for the "listening" line (in cluster mode: printed once the broker has registered)."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"broker exited during startup (code {self.proc.wait()}):\n{self.log_tail()}")
            if line.startswith("oncelog listener "):
                name = line.split()[2]
                self.listener_ports[name] = int(line.rsplit(":", 1)[1])
            elif line.startswith("oncelog listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                if not self.metrics:
                    return self
            elif line.startswith("oncelog metrics on "):
                self.metrics_port = int(line.rsplit(":", 1)[1])
                return self
        self.kill()
        raise RuntimeError(f"broker did not start in {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: a clean shutdown."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._close()
        return code

    def kill(self) -> None:
        """SIGKILL: nothing is flushed, nothing is closed."""
        if self.proc is None:
            return
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._close()

    def restart(self, clean: bool = False) -> BrokerProcess:
        self.stop() if clean else self.kill()
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def reap(self) -> int | None:
        """After the process exited on its own: its exit status (negative: the signal that ended it), and the
        handle released so `start` may run it again. None when there was no process."""
        if self.proc is None:
            return None
        code = self.proc.wait()
        self._close()
        return code

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> BrokerProcess:
        return self if self.alive() else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.stop()


class ClusterProcess:
    """A coordination service and `n` brokers (node ids 1..n) on loopback, each a process of its own.

    Layout under `directory`: `coordination/` (ZooKeeper's data and log), `broker-<id>/` (a broker's data) and
    `broker-<id>-broker.log` (its log). `settings` go to every broker (Kafka's key names, e.g.
    `oncelog.coordination.session.timeout.ms`); `broker_settings` {node id: settings} to one. Brokers keep their
    ports across restarts; `bootstrap` lists them all. With `connect` (a running coordination service's connect
    string, chroot included) no coordination service of its own is started or stopped. A broker whose
    `broker_settings` name its own `oncelog.coordination.connect` keeps it (a test relays one through a proxy).
    `own_process_groups`: each broker in a process group of its own (BrokerProcess `own_group`).
    """

    def __init__(self, directory: str | Path, n: int = 3, settings: Mapping[str, object] | None = None, *,
                 broker_settings: Mapping[int, Mapping[str, object]] | None = None,
                 chroot: str | None = None, coordination_port: int = 0, broker_ports: Iterable[int] = (),
                 connect: str | None = None, own_process_groups: bool = False) -> None:
        from .cluster.coordination_service import CoordinationService

        self.directory = Path(os.path.abspath(directory))
        self.n = n
        self.settings = dict(settings or {})
        self.chroot = chroot or f"/oncelog-{uuid.uuid4().hex[:8]}"
        self._external = connect
        self.coordination = None if connect else CoordinationService(self.directory / "coordination",
                                                                      port=coordination_port)
        ports = list(broker_ports)
        self.brokers: dict[int, BrokerProcess] = {}
        for node_id in range(1, n + 1):
            merged = {**self.settings, **dict((broker_settings or {}).get(node_id, {})), "node.id": node_id}
            broker = BrokerProcess(self.directory / f"broker-{node_id}", merged, own_group=own_process_groups)
            if node_id <= len(ports):
                broker.port = ports[node_id - 1]
            self.brokers[node_id] = broker

    @property
    def connect(self) -> str:
        """The coordination connect string the brokers use (`oncelog.coordination.connect`)."""
        if self._external is not None:
            return self._external
        assert self.coordination is not None
        return self.coordination.connect_string(self.chroot)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    @property
    def session_timeout_ms(self) -> int:
        return int(self.settings.get("oncelog.coordination.session.timeout.ms", 9000))

    def start(self, timeout: float = 120.0) -> ClusterProcess:
        """The coordination service, then every broker side by side; returns once each broker sees all n."""
        deadline = time.monotonic() + timeout
        try:
            if self.coordination is not None and not self.coordination.alive():
                self.coordination.start()
            launched = []
            for broker in self.brokers.values():
                broker.settings.setdefault("oncelog.coordination.connect", self.connect)
                if not broker.alive():
                    broker.launch()
                    launched.append(broker)
            for broker in launched:
                broker.wait_ready(max(deadline - time.monotonic(), 1.0))
            for node_id in self.brokers:   # each one's view: the controller's decides what CreateTopics can place
                self.wait_registered(set(self.brokers), max(deadline - time.monotonic(), 1.0), via=node_id)
        except BaseException:
            self.kill_all()
            raise
        return self

    def start_broker(self, node_id: int, timeout: float = 60.0) -> BrokerProcess:
        broker = self.brokers[node_id]
        broker.settings.setdefault("oncelog.coordination.connect", self.connect)
        return broker.start(timeout)

    def stop_broker(self, node_id: int, timeout: float = 60.0) -> int:
        """SIGTERM (a controlled shutdown) and wait; the exit code."""
        return self.brokers[node_id].stop(timeout)

    def kill(self, node_id: int) -> None:
        """SIGKILL one broker."""
        self.brokers[node_id].kill()

    def restart(self, node_id: int, clean: bool = False, timeout: float = 60.0) -> BrokerProcess:
        """SIGKILL (SIGTERM when `clean`) one broker and start it again on its port and data. After a SIGKILL
        the new process waits for its previous session to expire before it registers (at most the session
        timeout)."""
        broker = self.brokers[node_id]
        broker.stop(timeout) if clean else broker.kill()
        return self.start_broker(node_id, timeout + self.session_timeout_ms / 1000)

    def stop(self, timeout: float = 60.0, order: list[int] | None = None) -> None:
        """Stop the brokers one at a time in `order` (default `stop_order()`), each SIGTERMed and waited for (its
        controlled shutdown moves its leaderships to brokers still running), then the coordination service.

        Not all at once: brokers stopping together move leaderships onto each other, and one whose controller
        stops under it waits for a controller that never comes (up to its stop timeout). One at a time, every
        leadership moves once per stop and the controller, stopped last, answers its own request."""
        for node_id in self.stop_order() if order is None else order:
            if self.brokers[node_id].alive():
                self.brokers[node_id].stop(timeout)
        if self.coordination is not None:
            self.coordination.stop()

    def stop_order(self) -> list[int]:
        """The brokers to stop, in order: by node id, the active controller last (when a live broker names one)."""
        alive = self.alive()
        controller = None
        for node_id in alive:
            try:
                controller = self.metadata(node_id, [], timeout=2.0).controller_id
                break
            except Exception:  # noqa: BLE001 - a broker starting or stuck: ask the next one
                continue
        return sorted(self.brokers, key=lambda n: (n == controller, n))

    def kill_all(self) -> None:
        for broker in self.brokers.values():
            if broker.alive():
                broker.kill()
        if self.coordination is not None:
            self.coordination.kill()

    def alive(self) -> list[int]:
        return [n for n, b in self.brokers.items() if b.alive()]

    # -- what the cluster says about itself (a Metadata request to a live broker) ------------------------------
    def metadata(self, via: int | None = None, topics: list[str] | None = None, timeout: float = 10.0) -> Any:
        """A Metadata (v12) response from broker `via` (default: the first live one), as kafka-python's object."""
        node = via if via is not None else self.alive()[0]
        return broker_metadata(self.brokers[node].port, topics, timeout)

    def controller(self, via: int | None = None) -> int:
        return self.metadata(via, []).controller_id

    def wait_registered(self, node_ids: set[int], timeout: float = 60.0, via: int | None = None) -> None:
        """Until a broker's Metadata lists exactly `node_ids` as live brokers (and names a controller)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                md = self.metadata(via, [])
                if {b.node_id for b in md.brokers} == node_ids and md.controller_id in node_ids:
                    return
            except Exception:  # noqa: BLE001 - a broker still starting or just killed: ask again
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"brokers {sorted(node_ids)} not all registered after {timeout}s")
            time.sleep(0.1)

    def __enter__(self) -> ClusterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def broker_metadata(port: int, topics: list[str] | None = None, timeout: float = 10.0) -> Any:
    """A Metadata (v12) request to the broker on 127.0.0.1:`port` (`topics` None: every topic; [] none); the
    response as kafka-python's object (`brokers`, `controller_id`, `topics`...)."""
    return asyncio.run(_metadata(port, topics, timeout))


async def _metadata(port: int, topics: list[str] | None, timeout: float) -> Any:
    from .client.connection import BrokerConnection
    from .protocol.apis import ApiKey

    conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=int(timeout * 1000),
                            connect_timeout_ms=int(timeout * 1000))
    await conn.connect()
    try:
        wanted = None if topics is None else [{"name": t} for t in topics]
        return await conn.call(ApiKey.METADATA, {"topics": wanted, "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False}, version=12)
    finally:
        await conn.close()


def start_cluster(directory: str | Path, n: int = 3, settings: Mapping[str, object] | None = None,
                  timeout: float = 120.0, **kwargs: Any) -> ClusterProcess:
    """A started `ClusterProcess`: the coordination service and `n` brokers; `stop()` it when done."""
    return ClusterProcess(directory, n, settings, **kwargs).start(timeout)
