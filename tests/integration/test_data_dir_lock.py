"""One broker per data directory (storage/dir_lock.py): a second `oncelog serve` on a directory a live broker uses
exits 1 at once, naming the directory, and the first one goes on serving; after a SIGKILL of the first, a new one
starts on the same directory (the lock went with the process) and finds the records."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.helpers import ck_consume, ck_producer, create_topic

from oncelog.embedded import BrokerProcess


def _second_serve(data_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncelog", "serve", "--data-dir", str(data_dir),
                           "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)


def test_a_second_broker_on_a_data_directory_in_use_is_refused(broker_factory, tmp_path, topic_name):
    first = broker_factory()
    create_topic(first.bootstrap, topic_name, 1)
    second = _second_serve(tmp_path / "data")
    assert second.returncode == 1
    assert f"data directory {tmp_path / 'data'} is in use by another process" in second.stderr
    producer = ck_producer(first.bootstrap)
    producer.produce(topic_name, b"after", partition=0)
    assert producer.flush(30) == 0
    first.kill()
    again = BrokerProcess(tmp_path / "data").start()
    try:
        assert [r.value for r in ck_consume(again.bootstrap, topic_name, {0: 0})] == [b"after"]
    finally:
        again.stop()
