"""The one error every security setting raises when the broker cannot start (or reconfigure) with it."""

from __future__ import annotations


class SecurityConfigError(ValueError):
    """A security setting the broker cannot start with; the message names the key."""
