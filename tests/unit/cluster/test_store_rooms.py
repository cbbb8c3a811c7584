"""The arrows between the rooms of cluster metadata (docs/metadata-store.md): metadata_store -> registration,
writes, loader -> session -> errors, every room -> znodes; no room imports the facade, and the rooms that do the
work do not import each other, except issue 23's: acls and entity_configs -> notifications (the change
notifications they write and follow), credentials and quotas -> entity_configs (the config entities they are
keys of). Checked on the source, so a new room or a new import is held to it."""

from __future__ import annotations

import ast
from pathlib import Path

import oncelog.cluster.store as store_package

STORE = Path(store_package.__file__).parent

# What each room may import from oncelog.cluster.store (by module name); anything else of the package is an arrow
# the design does not have.
ALLOWED = {
    "errors": set(),
    "znodes": set(),
    "session": {"errors", "znodes", "znode_acls"},
    "registration": {"errors", "znodes", "session"},
    "writes": {"errors", "znodes", "session"},
    "loader": {"errors", "znodes", "session"},
    "notifications": {"errors", "znodes", "session"},
    "acls": {"errors", "znodes", "session", "notifications"},
    "entity_configs": {"errors", "znodes", "session", "notifications"},
    "credentials": {"errors", "znodes", "entity_configs", "notifications", "znode_acls"},
    "quotas": {"znodes", "entity_configs"},
    "znode_acls": {"errors"},
}


def imported(path: Path) -> set[str]:
    """Absolute names of the oncelog modules `path` imports (relative imports resolved)."""
    package = "oncelog.cluster.store"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_every_room_has_its_arrows():
    rooms = {p.stem for p in STORE.glob("*.py")} - {"__init__"}
    assert rooms == set(ALLOWED), "a new room: give it its arrows here"
    for room, allowed in ALLOWED.items():
        names = imported(STORE / f"{room}.py")
        assert not any(n.startswith("oncelog.cluster.metadata_store") for n in names), f"{room} imports the facade"
        inside = {n.split(".")[3] for n in names if n.startswith("oncelog.cluster.store.")}
        assert inside <= allowed, f"{room} imports {sorted(inside - allowed)}"


def test_znodes_and_errors_are_pure():
    for room in ("znodes", "errors"):
        names = imported(STORE / f"{room}.py")
        assert not any(n.split(".")[0] in ("kazoo", "asyncio") for n in names), room
