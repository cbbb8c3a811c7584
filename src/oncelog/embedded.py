"""Run a real oncelog broker as a subprocess: for tests, benchmarks and pipelines that embed one.

A broker listens on an ephemeral port (`--listen 127.0.0.1:0`) and announces the port
on stdout; a restart reuses that port so clients reconnect to the same address.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class BrokerProcess:
    def __init__(self, data_dir: str | Path, settings: dict[str, object] | None = None,
                 metrics: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.settings = dict(settings or {})
        self.metrics = metrics
        self.port = 0
        self.metrics_port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        args = [sys.executable, "-m", "oncelog", "serve", "--data-dir", str(self.data_dir),
                "--listen", f"127.0.0.1:{self.port}"]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        if self.metrics:
            args += ["--metrics-listen", f"127.0.0.1:{self.metrics_port}"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log_file, text=True)
        log_file.close()
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"broker exited during startup (code {self.proc.wait()}):\n{self.log_tail()}")
            if line.startswith("oncelog listening on "):
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

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> BrokerProcess:
        return self if self.alive() else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.stop()
