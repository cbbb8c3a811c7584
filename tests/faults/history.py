"""Operation histories of fault runs: one JSON line per event, one file per worker process.

A worker writes each line before it moves on and flushes it, so a SIGKILLed client leaves a history that ends
exactly where it died: an `invoke` with no completion is an operation of unknown outcome, as in Jepsen.

Events (all carry `w` the worker name and `t` a wall-clock time in seconds):
- send:   {"op": "send", "phase": "invoke"|"ok"|"fail", "v": value, "p": partition, "seq": n, "txn": id|None,
           "offset": o (ok only, -1 when the broker answered a duplicate without an offset)}
- txn:    {"op": "txn", "phase": "begin"|"commit-invoke"|"commit-ok"|"commit-fail"|"abort-invoke"|"abort-ok"|
           "abort-fail", "txn": id}
- read:   {"op": "read", "iso": "rc"|"ru", "session": s, "p": partition, "offset": o, "v": value}
- delete: {"op": "delete", "p": partition, "before": offset}        (DeleteRecords that the broker acknowledged)
- lso:    {"op": "lso", "p": partition, "lso": o, "hwm": o}           (samples of the last stable offset)
- batch:  {"op": "batch", "id": n, "rows": r}                       (a Spark micro-batch the pipeline finished)
- fault:  {"op": "fault", "kind": name, "phase": "start"|"stop"}      (written by the nemesis; client-kill adds
          {"phase": "victim", "victim": worker} naming the process it SIGKILLed)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO


class HistoryWriter:
    """Append-only JSONL writer; every event is flushed so a kill -9 loses nothing written before it."""

    def __init__(self, path: str | Path, worker: str) -> None:
        self.worker = worker
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the worker

    def log(self, op: str, **fields: Any) -> None:
        fields["op"] = op
        fields["w"] = self.worker
        fields["t"] = time.time()
        if self._file.closed:
            # A late event (the cluster's convergence report after the run's logs were closed) must not end the
            # run with a ValueError that hides the checker's verdict; it still reaches stdout.
            print(json.dumps(fields, separators=(",", ":")))
            return
        self._file.write(json.dumps(fields, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()


def read_events(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Every event of every `*.jsonl` file in `directory`; a torn last line (writer killed mid-write) is skipped."""
    for path in sorted(Path(directory).glob("*.jsonl")):
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                yield json.loads(line)
