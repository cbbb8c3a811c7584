"""The coordination connect string (oncelog.cluster.connect): HOST:PORT[,HOST:PORT...][/CHROOT], no scheme."""

from __future__ import annotations

import pytest

from oncelog.cluster.connect import ConnectString, connect_string, parse_connect


@pytest.mark.parametrize("text, hosts, chroot", [
    ("127.0.0.1:2181", [("127.0.0.1", 2181)], None),
    ("127.0.0.1:2181,127.0.0.1:2182/oncelog", [("127.0.0.1", 2181), ("127.0.0.1", 2182)], "/oncelog"),
    ("zk1, zk2:2182", [("zk1", 2181), ("zk2", 2182)], None),
    ("zk1,zk2:2182/a/b", [("zk1", 2181), ("zk2", 2182)], "/a/b"),
    ("[::1]:2181/x", [("::1", 2181)], "/x"),
    ("127.0.0.1:2181/", [("127.0.0.1", 2181)], None),
])
def test_parses_hosts_and_chroot(text, hosts, chroot):
    conn = parse_connect(text)
    assert conn == ConnectString(tuple(hosts), chroot)
    assert parse_connect(str(conn)) == conn


def test_the_string_is_what_kazoo_reads():
    from kazoo.hosts import collect_hosts

    for text in ("127.0.0.1:2181,127.0.0.1:2182/oncelog", "[::1]:2181", "h:1/a/b"):
        conn = parse_connect(text)
        assert collect_hosts(str(conn)) == (list(conn.hosts), conn.chroot)


@pytest.mark.parametrize("text, message", [
    ("zk://127.0.0.1:2181", "no scheme"),
    ("127.0.0.1:2181,,127.0.0.1:2182", "empty host"),
    ("127.0.0.1:99999", "bad HOST:PORT"),
    ("127.0.0.1:port", "bad HOST:PORT"),
    ("127.0.0.1:0", "port 0"),
    ("127.0.0.1:2181/a//b", "chroot"),
    ("127.0.0.1:2181/a/", "chroot"),
    ("127.0.0.1:2181/a/../b", "chroot"),
    ("", "empty host"),
])
def test_refuses_what_kazoo_would_misread(text, message):
    with pytest.raises(ValueError, match=message):
        parse_connect(text)


def test_connect_string_builds_with_a_chroot():
    assert connect_string([("127.0.0.1", 1), ("127.0.0.1", 2)], "/oncelog") == "127.0.0.1:1,127.0.0.1:2/oncelog"
    assert connect_string([("::1", 3)]) == "[::1]:3"
    with pytest.raises(ValueError, match="chroot"):
        connect_string([("127.0.0.1", 1)], "oncelog")
