"""Linux calls Python's os module does not offer (sync_file_range, syncfs), loaded from libc through ctypes.

ctypes releases the GIL for the length of each call, so a flush thread blocked in one leaves the loop running.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from typing import Any


def libc_function(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    """libc's `name` returning int and setting errno, or None where it does not exist (not Linux, old libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    call.argtypes = argtypes
    call.restype = ctypes.c_int
    return call
