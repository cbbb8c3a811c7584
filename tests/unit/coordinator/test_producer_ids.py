"""ProducerIdManager: ids unique across blocks and restarts, each block durable before use, the next one reserved
on a thread of its own (issue 24: the write held the event loop for about 10 ms inside an InitProducerId)."""

from __future__ import annotations

import json
import threading

from oncelog.coordinator.txn import producer_ids as module
from oncelog.coordinator.txn.producer_ids import ProducerIdManager


def _on_disk(path) -> int:
    return json.loads(path.read_text())["next_block_start"]


def test_ids_are_unique_and_below_what_the_file_reserves_across_blocks_and_restarts(tmp_path):
    path = tmp_path / "producer-ids.json"
    seen: list[int] = []
    for _ in range(3):  # three broker lifetimes
        manager = ProducerIdManager(path, block_size=10)
        manager.load()
        for _ in range(27):
            pid = manager.next_id()
            assert pid < _on_disk(path)  # durable before handed out
            seen.append(pid)
    assert len(set(seen)) == len(seen) and seen == sorted(seen)


def test_the_next_block_is_written_off_the_calling_thread(tmp_path, monkeypatch):
    writers: list[str] = []
    real = module.atomic_write

    def recording(path, data):
        writers.append(threading.current_thread().name)
        real(path, data)

    monkeypatch.setattr(module, "atomic_write", recording)
    manager = ProducerIdManager(tmp_path / "producer-ids.json", block_size=10)
    manager.load()  # the first block: on the caller, before serving
    ids = [manager.next_id() for _ in range(25)]
    assert ids == list(range(25))
    main = threading.current_thread().name
    assert writers[0] == main
    assert writers[1:] and all(name.startswith("oncelog-producer-ids") for name in writers[1:]), writers
