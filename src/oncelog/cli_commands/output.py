"""How client commands print: aligned tables for people, JSON for scripts, progress bars on stderr.

Results go to stdout and nothing else does, so `--json` output can be piped straight into a
parser; progress and messages go to stderr. Progress bars are drawn only on a terminal
(or with --progress), so logs and test captures stay clean.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, TextIO


def print_json(data: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(data, indent=2, sort_keys=False), file=stream or sys.stdout)


def print_json_line(data: Any, stream: TextIO | None = None) -> None:
    """One object per line (JSON Lines): for streams of records."""
    print(json.dumps(data, separators=(",", ":")), file=stream or sys.stdout)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, two spaces apart; numbers right-aligned."""
    text_rows = [[cell(v) for v in row] for row in rows]
    numeric = [all(_is_number(r[i]) for r in text_rows) and bool(text_rows) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in text_rows]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in text_rows])


def _is_number(text: str) -> bool:
    return text.lstrip("-").isdigit() or text == "-"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], stream: TextIO | None = None) -> None:
    print(table(headers, rows), file=stream or sys.stdout)


class Progress:
    """A one-line progress bar on stderr: a bar and percentage when the total is known, a counter otherwise."""

    WIDTH = 30

    def __init__(self, label: str, total: int | None = None, *, unit: str = "records", enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._start = time.monotonic()
        self._drawn = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now - self._drawn >= 0.1:
                self._drawn = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self._start, 1e-9)
        if self.total:
            share = min(self.done / self.total, 1.0)
            filled = int(share * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            text = f"{self.label} [{bar}] {share * 100:5.1f}% {self.done}/{self.total} {self.unit}"
        else:
            text = f"{self.label} {self.done} {self.unit}"
        self.stream.write(f"\r{text} ({rate:,.0f}/s)\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
