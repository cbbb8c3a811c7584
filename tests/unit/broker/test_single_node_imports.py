"""The single node runs none of cluster mode: building and starting a broker without
oncelog.coordination.connect never imports kazoo (docs/cluster.md §8)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_single_node_broker_never_imports_kazoo(tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, sys
        from oncelog.broker.server import Broker
        from oncelog.config import load_broker_config

        async def main():
            broker = Broker(load_broker_config(), {str(tmp_path)!r}, port=0)
            await broker.start()
            await broker.stop()
            assert broker.cluster is None

        asyncio.run(main())
        print("kazoo" in sys.modules, any(m.startswith("oncelog.cluster.metadata_store") for m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
