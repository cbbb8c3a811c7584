"""security/tls.PrincipalMapper: ssl.principal.mapping.rules with Java's replacement syntax, checked when the rules
are read (a rule that cannot be applied used to fail, with re.error escaping the connection's setup, every TLS
handshake whose certificate name it matched; found by tests/fuzz/test_fuzz_auth.py)."""

from __future__ import annotations

import pytest

from oncelog.security.tls import PrincipalMapper, TlsConfigError


@pytest.mark.parametrize(("rules", "name", "expected"), [
    ("DEFAULT", "CN=alice,OU=Eng", "CN=alice,OU=Eng"),
    ("RULE:^CN=(.*?),OU=(.*)$/$1@$2/L, DEFAULT", "CN=Alice,OU=Eng", "alice@eng"),
    ("RULE:^CN=(.*?),OU=(.*)$/$1/U", "CN=alice,OU=Eng", "ALICE"),
    ("RULE:^CN=(.*)$/$0!/", "CN=x", "CN=x!"),  # $0: the whole name
    ("RULE:^(.*)$/a\\$b/", "x", "a$b"),  # \$: a literal dollar
    ("RULE:^(.*)$/a\\\\$1/", "x", "a\\x"),  # \\: a literal backslash
    ("RULE:^(.*)$/a\\q\\/$1/", "x", "a\\q/x"),  # any other backslash is literal; \/ is a slash
    ("RULE:^(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)$/$11$12/", "abcdefghijk", "ka2"),  # digits join while a group exists
    ("RULE:^CN=(.*),OU=Eng$/$1/,RULE:^CN=(.*)$/other-$1/", "CN=bob", "other-bob"),
    ("RULE:^CN=(.*),OU=Eng$/$1/", "CN=bob", None),  # no rule matches: the connection is refused
])
def test_rules_map_names_as_kafka(rules, name, expected):
    assert PrincipalMapper(rules).name(name) == expected


@pytest.mark.parametrize("rules", [
    "RULE:^CN=(.*)$/$2/",  # the regex has one group
    "RULE:^CN=.*$/$1/",  # and this none
    "RULE:/$1/",
    "RULE:^(.*)$/a$/",  # a dollar naming nothing (Java refuses it too)
    "RULE:^(.*)$/${name}/",
    "RULE:^(.*)$/$²/",
    "RULE:^(.*$/$1/",  # not a regex
    "nonsense",
])
def test_rules_that_cannot_be_applied_are_refused_when_read(rules):
    with pytest.raises(TlsConfigError, match="ssl.principal.mapping.rules"):
        PrincipalMapper(rules)
