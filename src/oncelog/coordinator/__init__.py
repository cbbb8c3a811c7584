"""Coordinators: transactions (`txn/`) and consumer groups (`group/`)."""
