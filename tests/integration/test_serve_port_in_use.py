"""`oncelog serve` on a port another socket holds: it binds its listener before it loads anything, so it exits 1
at once with the cluster's wording (`HOST:PORT is already in use by another process`) instead of an asyncio
`[Errno 98] error while attempting to bind` after every log was opened; the socket holding the port is untouched."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_serve_on_a_port_in_use_says_so_before_loading_any_log(tmp_path):
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "oncelog", "serve", "--data-dir", str(tmp_path / "data"),
             "--listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 1
        assert done.stderr.splitlines() == [f"oncelog: cannot start: 127.0.0.1:{port} is already in use by another process"]
        # nothing was loaded: the log manager's "loaded N topics" line is the first thing a start logs
        assert "loaded" not in done.stderr and "Errno" not in done.stderr
        assert "oncelog listening" not in done.stdout
        # the holder still owns the port
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            conn, _ = holder.accept()
            conn.close()
    finally:
        holder.close()

