"""ZooKeeper, the coordination service cluster mode keeps its metadata on, as child JVM processes.

For development and tests: `CoordinationService` is one member (ZooKeeper standalone), `Ensemble` is N members
on one host, each with its own directory and ports. Both start with start(timeout), stop with stop() (SIGTERM,
then SIGKILL after a bound) and work as context managers; kill()/restart() serve fault tests.

Each member is `java -cp <jars> org.apache.zookeeper.server.quorum.QuorumPeerMain <dir>/zoo.cfg` (the jars:
zookeeper_jars.py). QuorumPeerMain runs a config without `server.N` lines standalone, so one main class serves
both. zoo.cfg is written into the member's directory at every start; the same directory is ZooKeeper's dataDir
(`version-2/` with snapshots and the transaction log, `myid` for an ensemble member), and the JVM's output, the
server log, is appended to `zookeeper.log` there. Settings (`settings` are merged last):

    tickTime 500 ms; initLimit 40, syncLimit 20 ticks (20 s and 10 s: generous on a loaded two-core machine)
    minSessionTimeout 2 ticks (1 s), maxSessionTimeout 60 s; maxClientCnxns 0 (no per-address limit)
    clientPortAddress: the host given (127.0.0.1 by default), never a wildcard
    4lw.commands.whitelist empty, admin.enableServer false, reconfigEnabled false
    autopurge: keep 3 snapshots, purge hourly (a long-running `oncelog coordination start` stays small)

With `sasl_users` ({user: password}) members also take SASL DIGEST-MD5 logins (docs/security.md §9): a JAAS file
`jaas.conf` with their `Server` section is written next to zoo.cfg and named to the JVM
(`-Djava.security.auth.login.config`), and zoo.cfg gets `authProvider.1=...SASLAuthenticationProvider`, so an
authenticated client is `sasl:<user>` to znode ACLs. Clients that do not log in are still served (what the ACLs let
them do) unless `require_sasl` (`sessionRequireClientSASLAuth=true`: ZooKeeper closes their session); the readiness
probe then logs in as the first user. Without `sasl_users` nothing of this is written.

ZooKeeper answers `srvr` whatever the whitelist says (its own zkServer.sh needs it); mode() reads it to tell the
leader from the followers. A member is ready once a ZooKeeper session to it opens (kazoo): session creation goes
through the same request pipeline, and in an ensemble through the quorum, as every write.

Members run in their own process group (only those groups are ever signalled) and, started from the main thread
on Linux, die with the Python process that started them (`setpriv --pdeathsig KILL`), so no JVM outlives it.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .connect import connect_string
from .zookeeper_jars import java_executable, zookeeper_classpath

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
DEFAULT_HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0          # per member: JVM start, data load, election; an ensemble's scales with its size
STOP_TIMEOUT_S = 30.0           # after SIGTERM, before SIGKILL
HEAP_MB = 128
TICK_TIME_MS = 500
PROBE_SESSION_TIMEOUT_S = 5.0   # the readiness probe's session: also how long one connect attempt may wait
PROBE_POLL_S = 0.2              # how often a readiness wait checks that the JVM still runs
PORT_ATTEMPTS = 3               # fresh ports when a port picked free was taken before ZooKeeper bound it
LOG_NAME = "zookeeper.log"
CONFIG_NAME = "zoo.cfg"
JAAS_NAME = "jaas.conf"
SASL_PROVIDER = "org.apache.zookeeper.server.auth.SASLAuthenticationProvider"
DIGEST_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"

_BIND_FAILURE = re.compile(r"BindException|Address already in use")
_MODE = re.compile(rb"^Mode: (\w+)", re.MULTILINE)


class CoordinationServiceError(RuntimeError):
    """A member exited or did not answer in time; the message ends with the tail of its log."""


class PortInUse(CoordinationServiceError):
    """A port the service was told to use (or restarted on) is taken by another process."""


_RUNNING: set[Member] = set()     # started and not yet stopped or killed


@atexit.register
def _kill_leftovers() -> None:
    """Members still running when the interpreter exits (a run interrupted before its teardown) are killed."""
    for member in list(_RUNNING):
        member.kill()


def orphan_guard() -> list[str]:
    """A prefix that makes the JVM die with this process (Linux setpriv --pdeathsig; setpriv execs the JVM, so
    the pid stays the JVM's). Only from the main thread: the signal follows the death of the *thread* that
    started the child, and the main thread lives as long as the interpreter."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"]


def _free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports the kernel had free a moment ago (bound together, so never the same twice)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _check_port_free(host: str, port: int) -> None:
    """PortInUse if something listens on host:port (bound as ZooKeeper binds: with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"{host}:{port} is already in use by another process") from None
            raise


def _quiet_logger() -> logging.Logger:
    """kazoo's logger for readiness probes: refused connections while a JVM starts are expected, not news."""
    logger = logging.getLogger("oncelog.cluster.coordination_service.probe")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def session_opens(servers: str, timeout: float, alive: Callable[[], bool] | None = None,
                  sasl_options: Mapping[str, str] | None = None) -> bool:
    """Whether a ZooKeeper session to `servers` opens (and answers a read) within `timeout` seconds; False at
    once when `alive()` turns false (the JVM being waited for exited).

    One client keeps trying for the whole wait. Its session timeout (PROBE_SESSION_TIMEOUT_S) bounds each
    connection attempt: kazoo waits that long for the answer to a connect request, so a server that accepted
    the connection before it could serve costs one such wait, not kazoo's default ten seconds."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException
    from kazoo.retry import KazooRetry

    client = KazooClient(hosts=servers, timeout=PROBE_SESSION_TIMEOUT_S, logger=_quiet_logger(),
                         connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_delay=0.5),
                         sasl_options=dict(sasl_options) if sasl_options else None)
    deadline = time.monotonic() + timeout
    try:
        connected = client.start_async()
        while not connected.wait(min(PROBE_POLL_S, max(deadline - time.monotonic(), 0.0))):
            if (alive is not None and not alive()) or time.monotonic() >= deadline:
                return False
        client.exists("/")
        return True
    except KazooException:
        return False
    finally:
        client.stop()
        client.close()


def server_jaas(users: Mapping[str, str]) -> str:
    """A JAAS file whose Server section lets ZooKeeper take DIGEST-MD5 logins of `users` ({user: password})."""
    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    options = "".join(f"\n    user_{user}={quoted(password)}" for user, password in users.items())
    return f"Server {{\n  {DIGEST_MODULE} required{options};\n}};\n"


def _prop_escape(value: str) -> str:
    """A value for zoo.cfg, a Java .properties file (backslashes and line breaks escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


# -- one member ---------------------------------------------------------------------------------------------


class Member:
    """One ZooKeeper JVM: its directory (dataDir, zoo.cfg, zookeeper.log), ports and process.

    Made by CoordinationService and Ensemble, which choose the ports and the zoo.cfg entries (`config`); `pid`,
    `alive()`, `address` ("host:client_port"), start/stop/kill/restart, `mode()` and `log_tail()` are for callers.
    """

    def __init__(self, member_id: int, directory: Path, host: str, heap_mb: int) -> None:
        self.member_id = member_id
        # Absolute: the JVM runs in this directory and is handed paths in it (zoo.cfg, java.io.tmpdir), so a
        # relative one would be taken twice over, once from here and once from there.
        self.directory = Path(os.path.abspath(directory))
        self.host = host
        self.heap_mb = heap_mb
        self.client_port = 0
        self.quorum_port = 0           # ensemble members only: followers connect to the leader here
        self.election_port = 0         # ensemble members only: leader election
        self.config: dict[str, str] = {}
        self.jvm_options: list[str] = []       # -D properties before the main class
        self.probe_sasl: dict[str, str] | None = None   # the readiness probe's login, when logins are required
        self.java = ""
        self.classpath = ""
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None    # of the last process, once it exited
        self.config_path = self.directory / CONFIG_NAME
        self.log_path = self.directory / LOG_NAME
        self._log_start = 0                   # where this start's output begins in the log

    @property
    def address(self) -> str:
        return connect_string([(self.host, self.client_port)])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # lifecycle

    def launch(self) -> None:
        """Write zoo.cfg (and myid) and start the JVM without waiting for it (start() waits)."""
        if self.alive():
            raise CoordinationServiceError(f"ZooKeeper member {self.member_id} is already running (pid {self.pid})")
        self.proc = None
        self.returncode = None
        self.directory.mkdir(parents=True, exist_ok=True)
        lines = ["# Written by oncelog at every start of this member; edits are overwritten."]
        lines += [f"{key}={_prop_escape(value)}" for key, value in self.config.items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        if any(key.startswith("server.") for key in self.config):
            (self.directory / "myid").write_text(f"{self.member_id}\n")
        args = [*orphan_guard(), self.java, f"-Xmx{self.heap_mb}m", f"-Xms{min(self.heap_mb, 32)}m",
                "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                f"-Djava.io.tmpdir={self.directory}", *self.jvm_options,
                "-Dorg.slf4j.simpleLogger.logFile=System.out", "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
                "-cp", self.classpath, MAIN_CLASS, str(self.config_path)]
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self.proc = subprocess.Popen(args, cwd=self.directory, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        _RUNNING.add(self)

    def start(self, timeout: float = START_TIMEOUT_S) -> Member:
        """Launch and wait until a session to this member opens; killed again if it does not in `timeout`."""
        self.launch()
        try:
            self.wait_serving(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_serving(self, timeout: float) -> None:
        """Until a ZooKeeper session to this member opens. CoordinationServiceError (PortInUse when the log says a
        bind failed) if the JVM exits first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                self._raise_exited("exited during startup")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinationServiceError(f"ZooKeeper member {self.member_id} ({self.address}) did not open "
                                               f"a session within {timeout:.0f} s:\n{self.log_tail()}")
            if session_opens(self.address, remaining, self.alive, self.probe_sasl):
                return

    def _raise_exited(self, what: str) -> None:
        code = self.proc.poll() if self.proc is not None else self.returncode
        tail = self.log_tail()
        self._reap()
        error = PortInUse if _BIND_FAILURE.search(tail) else CoordinationServiceError
        raise error(f"ZooKeeper member {self.member_id} ({self.address}) {what} (exit code {code}):\n{tail}")

    def wait(self, timeout: float | None = None) -> int:
        """Block until the JVM exits (subprocess.TimeoutExpired after `timeout`); its exit code."""
        if self.proc is None:
            return self.returncode if self.returncode is not None else 0
        code = self.proc.wait(timeout)
        self._reap()
        return code

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait; SIGKILL after `timeout`. The JVM's exit code (None if it was not running)."""
        if self.proc is None:
            return None
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        code = self.proc.returncode
        self._reap()
        return code

    def kill(self) -> None:
        """SIGKILL: nothing is flushed or closed (ZooKeeper fsyncs every transaction before acknowledging it)."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait()
        self._reap()

    def restart(self, timeout: float = START_TIMEOUT_S, clean: bool = False) -> Member:
        """Stop (SIGTERM when `clean`, else SIGKILL) and start again on the same ports and data."""
        self.stop() if clean else self.kill()
        return self.start(timeout)

    def _signal(self, sig: signal.Signals) -> None:
        """Signal the process group this member's JVM leads (only ever a process we started)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        if self.proc is not None:
            self.returncode = self.proc.poll()
        self.proc = None
        _RUNNING.discard(self)

    # state

    def mode(self, timeout: float = 5.0) -> str | None:
        """"leader", "follower", "standalone" (ZooKeeper's `srvr` answer), or None when not serving."""
        try:
            with socket.create_connection((self.host, self.client_port), timeout=timeout) as sock:
                sock.sendall(b"srvr")
                chunks = []
                while chunk := sock.recv(4096):
                    chunks.append(chunk)
        except OSError:
            return None
        match = _MODE.search(b"".join(chunks))
        return match.group(1).decode() if match else None

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines this member's current (or last) JVM wrote."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                text = log.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return f"--- {self.log_path} ---\n" + "\n".join(text) if text else f"(no output in {self.log_path})"

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive() else "stopped"
        return f"<ZooKeeper member {self.member_id} {self.address} {state}>"


# -- shared by one member and many --------------------------------------------------------------------------


class _Members:
    """What CoordinationService and Ensemble share: settings, zoo.cfg, ports, start and stop."""

    def __init__(self, directories: list[Path], host: str, *, settings: Mapping[str, object] | None,
                 heap_mb: int, tick_time_ms: int, java: str | None, classpath: str | None,
                 start_timeout: float, sasl_users: Mapping[str, str] | None = None,
                 require_sasl: bool = False) -> None:
        if require_sasl and not sasl_users:
            raise ValueError("require_sasl needs sasl_users")
        self.host = host
        self.sasl_users = dict(sasl_users or {})
        self.require_sasl = require_sasl
        self.settings = {key: str(value) for key, value in (settings or {}).items()}
        self.tick_time_ms = tick_time_ms
        self.java = java
        self.classpath = classpath
        self.start_timeout = start_timeout
        self.members = [Member(i, directory, host, heap_mb) for i, directory in enumerate(directories, 1)]
        self._ports_fixed = False     # ports chosen by the caller or bound once: restarts reuse them

    @property
    def servers(self) -> str:
        """The connect string of every member, "127.0.0.1:p1,127.0.0.1:p2,..." (no chroot)."""
        return ",".join(m.address for m in self.members)

    def connect_string(self, chroot: str | None = None) -> str:
        """`servers` with a chroot ("/oncelog"), what `oncelog.coordination.connect` takes."""
        return connect_string([(m.host, m.client_port) for m in self.members], chroot)

    def _config(self, member: Member) -> dict[str, str]:
        config = {
            "tickTime": str(self.tick_time_ms),
            "initLimit": "40",
            "syncLimit": "20",
            "dataDir": str(member.directory.resolve()),
            "clientPort": str(member.client_port),
            "clientPortAddress": member.host,
            "maxSessionTimeout": "60000",
            "maxClientCnxns": "0",
            "4lw.commands.whitelist": "",
            "admin.enableServer": "false",
            "reconfigEnabled": "false",
            "autopurge.snapRetainCount": "3",
            "autopurge.purgeInterval": "1",
        }
        if self.sasl_users:
            config["authProvider.1"] = SASL_PROVIDER
            if self.require_sasl:
                config["sessionRequireClientSASLAuth"] = "true"
        if len(self.members) > 1:
            for m in self.members:
                config[f"server.{m.member_id}"] = f"{m.host}:{m.quorum_port}:{m.election_port}"
        config.update(self.settings)
        return config

    def _pick_ports(self) -> None:
        multi = len(self.members) > 1
        ports = _free_ports(self.host, len(self.members) * (3 if multi else 1))
        for member in self.members:
            member.client_port = ports.pop()
            if multi:
                member.quorum_port, member.election_port = ports.pop(), ports.pop()

    def _prepare(self) -> None:
        self.java = self.java or java_executable()
        self.classpath = self.classpath or zookeeper_classpath()
        for member in self.members:
            member.java, member.classpath = self.java, self.classpath
            member.config = self._config(member)
            member.jvm_options, member.probe_sasl = [], None
            if self.sasl_users:
                member.directory.mkdir(parents=True, exist_ok=True)
                jaas = member.directory / JAAS_NAME
                jaas.write_text(server_jaas(self.sasl_users))
                jaas.chmod(0o600)
                member.jvm_options = [f"-Djava.security.auth.login.config={jaas}"]
                if self.require_sasl:
                    user, password = next(iter(self.sasl_users.items()))
                    member.probe_sasl = {"mechanism": "DIGEST-MD5", "username": user, "password": password}

    def _start_all(self, timeout: float) -> None:
        """Launch every member at once (an ensemble elects a leader only with a quorum up), then wait for each;
        with ports of our own choosing, fresh ones after a bind failure."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if not self._ports_fixed:
                self._pick_ports()
            elif len(self.members) == 1:
                _check_port_free(self.host, self.members[0].client_port)
            self._prepare()
            for member in self.members:
                member.launch()
            try:
                self._wait_members(self.members, timeout)
            except PortInUse:
                self._stop_members(self.members, STOP_TIMEOUT_S)
                if self._ports_fixed or attempt == PORT_ATTEMPTS:
                    raise
                continue
            except BaseException:
                self._stop_members(self.members, STOP_TIMEOUT_S)
                raise
            self._ports_fixed = True
            return

    @staticmethod
    def _wait_members(members: list[Member], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for member in members:
            member.wait_serving(max(deadline - time.monotonic(), 0.1))

    @staticmethod
    def _stop_members(members: list[Member], timeout: float) -> None:
        """SIGTERM every running member at once, wait; SIGKILL whatever is left after `timeout`."""
        running = [m for m in members if m.alive()]
        for member in running:
            member._signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for member in running:
            member.stop(max(deadline - time.monotonic(), 0.1))
        for member in members:
            member.kill()     # reaps one that exited on its own

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every member, SIGKILL those still running after `timeout`."""
        self._stop_members(self.members, timeout)


# -- one member ---------------------------------------------------------------------------------------------


class CoordinationService(_Members):
    """One ZooKeeper (standalone) on `host`:`port` with its data in `data_dir`; port 0 picks a free one.
    `sasl_users`, `require_sasl`: SASL DIGEST-MD5 logins (see the module docstring).

    The port is kept once bound: restart() and a later start() use it again (a client's connect string stays
    valid). A data dir used before keeps its znodes. Both write zoo.cfg and the JAAS file again, so `settings` and
    `sasl_users` changed in between take effect (a test restarts ZooKeeper with another password for a user).
    """

    def __init__(self, data_dir: str | Path, host: str = DEFAULT_HOST, port: int = 0, *,
                 settings: Mapping[str, object] | None = None, heap_mb: int = HEAP_MB,
                 tick_time_ms: int = TICK_TIME_MS, java: str | None = None, classpath: str | None = None,
                 start_timeout: float = START_TIMEOUT_S, sasl_users: Mapping[str, str] | None = None,
                 require_sasl: bool = False) -> None:
        super().__init__([Path(data_dir)], host, settings=settings, heap_mb=heap_mb, tick_time_ms=tick_time_ms,
                         java=java, classpath=classpath, start_timeout=start_timeout, sasl_users=sasl_users,
                         require_sasl=require_sasl)
        if port:
            self.member.client_port = port
            self._ports_fixed = True

    @property
    def member(self) -> Member:
        return self.members[0]

    @property
    def port(self) -> int:
        """The client port (0 until the first start picked one)."""
        return self.member.client_port

    @property
    def data_dir(self) -> Path:
        return self.member.directory

    @property
    def pid(self) -> int | None:
        return self.member.pid

    def alive(self) -> bool:
        return self.member.alive()

    def start(self, timeout: float | None = None) -> CoordinationService:
        """Start and wait until a session opens; PortInUse when a port given is taken, CoordinationUnavailable
        when java or the jars are missing, CoordinationServiceError (with the log's tail) otherwise."""
        if self.member.alive():
            raise CoordinationServiceError(f"already running (pid {self.pid})")
        self._start_all(timeout or self.start_timeout)
        return self

    def wait(self, timeout: float | None = None) -> int:
        """Block until the JVM exits; its exit code."""
        return self.member.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the JVM."""
        self.member.kill()

    def restart(self, timeout: float | None = None, clean: bool = False) -> CoordinationService:
        """SIGKILL (SIGTERM when `clean`) and start again on the same port and data, with the current `settings`
        and `sasl_users`."""
        self.member.stop() if clean else self.member.kill()
        self._prepare()
        self.member.start(timeout or self.start_timeout)
        return self

    def log_tail(self, lines: int = 40) -> str:
        return self.member.log_tail(lines)

    def __enter__(self) -> CoordinationService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<CoordinationService {self.member!r}>"


# -- an ensemble --------------------------------------------------------------------------------------------


class Ensemble(_Members):
    """`size` ZooKeeper members (ids 1..size) on `host`, in `directory`/member-<id>, each with a client, a quorum
    and an election port picked at the first start and kept after (restarts reuse them).

    A write is acknowledged once a majority has it in its transaction log, so with 3 members any one may be
    killed without losing or refusing acknowledged writes.
    """

    def __init__(self, directory: str | Path, size: int = 3, host: str = DEFAULT_HOST, *,
                 settings: Mapping[str, object] | None = None, heap_mb: int = HEAP_MB,
                 tick_time_ms: int = TICK_TIME_MS, java: str | None = None, classpath: str | None = None,
                 start_timeout: float | None = None) -> None:
        if size < 1:
            raise ValueError("an ensemble has at least one member")
        self.directory = Path(os.path.abspath(directory))
        super().__init__([self.directory / f"member-{i}" for i in range(1, size + 1)], host, settings=settings,
                         heap_mb=heap_mb, tick_time_ms=tick_time_ms, java=java, classpath=classpath,
                         start_timeout=start_timeout or START_TIMEOUT_S * (1 + 0.5 * (size - 1)))

    def member(self, member_id: int) -> Member:
        """Member `member_id` (1..size)."""
        if not 1 <= member_id <= len(self.members):
            raise KeyError(f"no ZooKeeper member {member_id} (ids 1..{len(self.members)})")
        return self.members[member_id - 1]

    def pid(self, member_id: int) -> int | None:
        return self.member(member_id).pid

    def start(self, timeout: float | None = None) -> Ensemble:
        """Start every member and wait until each opens sessions (so a quorum has formed and all are synced)."""
        if any(m.alive() for m in self.members):
            raise CoordinationServiceError("ensemble already (partly) running; use revive() or restart()")
        self._start_all(timeout or self.start_timeout)
        return self

    def kill(self, member_id: int) -> None:
        """SIGKILL one member."""
        self.member(member_id).kill()

    def stop_member(self, member_id: int, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM one member (SIGKILL after `timeout`); its exit code."""
        return self.member(member_id).stop(timeout)

    def restart(self, member_id: int, timeout: float | None = None, clean: bool = False) -> Member:
        """SIGKILL (SIGTERM when `clean`) one member and start it again on its ports and data; returns once it
        opens sessions, i.e. it has rejoined the quorum and caught up with the leader."""
        return self.member(member_id).restart(timeout or START_TIMEOUT_S, clean)

    def revive(self, timeout: float | None = None) -> None:
        """Start every member that is not running and wait until all open sessions (no-op when all run)."""
        down = [m for m in self.members if not m.alive()]
        if not down:
            return
        if not self._ports_fixed:
            self.start(timeout)
            return
        for member in down:
            member.launch()
        try:
            self._wait_members(down, timeout or self.start_timeout)
        except BaseException:
            for member in down:
                member.kill()
            raise

    def leader(self, timeout: float = 30.0, exclude: tuple[int, ...] = ()) -> int:
        """The id of the member that is leader now (asked with `srvr`), waiting up to `timeout` for one."""
        deadline = time.monotonic() + timeout
        modes: dict[int, str | None] = {}
        while True:
            modes = {m.member_id: m.mode() for m in self.members if m.alive() and m.member_id not in exclude}
            leaders = [i for i, mode in modes.items() if mode == "leader"]
            if len(leaders) == 1:
                return leaders[0]
            if time.monotonic() >= deadline:
                raise CoordinationServiceError(f"no single leader within {timeout:.0f} s (modes {modes})")
            time.sleep(0.1)

    def __enter__(self) -> Ensemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Ensemble {self.members!r}>"
