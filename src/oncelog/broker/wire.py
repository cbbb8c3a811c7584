"""What a response is made of on its way to the socket: bytes and parts of segment files.

A handler returns a list of pieces; the connection writes bytes as they are and sends a
`FileRegion` with sendfile (or pread when small). This sits at the bottom of `broker/` so
the connection, the dispatcher and the fetch handler share it without importing each other.
"""

from __future__ import annotations

import os
from typing import Any


class FileRegion:
    """Part of a segment file to send with sendfile; owns its (dup'd) descriptor."""

    __slots__ = ("fd", "position", "size")

    def __init__(self, fd: int, position: int, size: int) -> None:
        self.fd = fd
        self.position = position
        self.size = size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def close_pieces(pieces: list[Any]) -> None:
    """Release the descriptors of a response that will not be sent (or has been)."""
    for piece in pieces:
        if isinstance(piece, FileRegion):
            piece.close()
