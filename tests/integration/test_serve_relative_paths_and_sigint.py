"""`oncelog serve` with the paths a user types (relative to where the command runs) and started as a background
job of a script (SIGINT inherited ignored): it serves from those paths, and SIGINT stops it cleanly, as it stops
`oncelog cluster start` and `oncelog coordination start` (tests/cluster)."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.cluster.dev_cluster import Lines, kill_quietly, round_trip

WAIT_S = 120.0


def test_relative_paths_and_an_inherited_ignored_sigint(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "server.properties").write_text("num.partitions=2\n")
    proc = subprocess.Popen([sys.executable, "-m", "oncelog", "serve", "--data-dir", "rel/data",
                             "--config", "conf/server.properties", "--listen", "127.0.0.1:0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        port = int(out.expect(r"^oncelog listening on [\d.]+:(\d+)$", WAIT_S).group(1))
        round_trip(f"127.0.0.1:{port}", "paths")        # auto-created with the config file's num.partitions
        proc.send_signal(signal.SIGINT)
        assert proc.wait(WAIT_S) == 0, err.rest()
    finally:
        kill_quietly(proc, tmp_path)
    assert sorted(p.name for p in (tmp_path / "rel" / "data").iterdir() if p.name.startswith("paths-")) == \
        ["paths-0", "paths-1"]
