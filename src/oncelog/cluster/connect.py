"""The coordination service's address, as brokers take it in `oncelog.coordination.connect`.

One format, ZooKeeper's own connect string (what Kafka's `zookeeper.connect` and kazoo's `hosts` take):

    HOST:PORT[,HOST:PORT...][/CHROOT]        e.g. 127.0.0.1:2181,127.0.0.1:2182/oncelog

A port left out is ZooKeeper's 2181; an IPv6 host is written in brackets ([::1]:2181). The chroot, when given,
is a znode path every path of the client is relative to, so several clusters can share one ensemble; it must
exist before a client uses it. There is no scheme: `zk://...` is refused with a message saying what to write
(kazoo would read "zk:" as a host and the rest as a chroot). The string parse_connect() accepts is passed to
kazoo unchanged.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_PORT = 2181


@dataclass(frozen=True)
class ConnectString:
    """A parsed connect string: (host, port) pairs in the order given, and the chroot ("/a/b") or None."""

    hosts: tuple[tuple[str, int], ...]
    chroot: str | None = None

    @property
    def servers(self) -> str:
        """The host list alone, "h1:p1,h2:p2" (no chroot)."""
        return ",".join(_host_port(host, port) for host, port in self.hosts)

    def __str__(self) -> str:
        return self.servers + (self.chroot or "")


def parse_connect(text: str) -> ConnectString:
    """Parse and check a connect string; ValueError says what is wrong with it."""
    text = text.strip()
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise ValueError(f"coordination connect string {text!r}: no scheme ({scheme}://); write "
                         "HOST:PORT[,HOST:PORT...][/CHROOT], e.g. 127.0.0.1:2181/oncelog")
    servers, slash, chroot = text.partition("/")
    hosts = []
    for item in servers.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"coordination connect string {text!r}: an empty host")
        try:
            parts = urllib.parse.urlsplit("//" + item)
            host, port = parts.hostname, parts.port
        except ValueError as exc:      # a port out of range or not a number
            raise ValueError(f"coordination connect string {text!r}: bad HOST:PORT {item!r} ({exc})") from None
        if not host or parts.path or parts.query or parts.fragment or parts.username:
            raise ValueError(f"coordination connect string {text!r}: bad HOST:PORT {item!r}")
        if port == 0:
            raise ValueError(f"coordination connect string {text!r}: port 0 in {item!r}")
        hosts.append((host, port or DEFAULT_PORT))
    return ConnectString(tuple(hosts), _chroot(text, "/" + chroot) if slash else None)


def connect_string(hosts: Iterable[tuple[str, int]], chroot: str | None = None) -> str:
    """The connect string of `hosts` with an optional chroot (checked as parse_connect checks it)."""
    conn = ConnectString(tuple(hosts), None)
    return str(ConnectString(conn.hosts, _chroot(conn.servers + (chroot or ""), chroot) if chroot else None))


def _chroot(text: str, chroot: str) -> str | None:
    if chroot == "/":
        return None
    segments = chroot.split("/")[1:]
    if not chroot.startswith("/") or any(seg in ("", ".", "..") for seg in segments):
        raise ValueError(f"coordination connect string {text!r}: chroot {chroot!r} must be an absolute znode "
                         "path without empty, '.' or '..' segments and without a trailing '/'")
    return chroot


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
