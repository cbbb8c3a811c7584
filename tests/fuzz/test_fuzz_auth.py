"""In-process fuzzing of the authentication path as pure functions: the SASL state machine and each mechanism's
server exchange fed damaged tokens, the OAUTHBEARER message parser, the JAAS parser and the principal mapping rules.

Oracles, each the function's contract:
- a mechanism's `step` returns bytes or raises AuthenticationFailed (what the client is told); anything else would
  reach the dispatcher as a broker fault. It never completes for a client that does not know the password.
- the state machine (`Authenticator`) never raises: every SaslHandshake gets NONE, UNSUPPORTED_SASL_MECHANISM or
  ILLEGAL_SASL_STATE, every SaslAuthenticate NONE, ILLEGAL_SASL_STATE or SASL_AUTHENTICATION_FAILED; after a failure
  nothing is allowed any more; a principal only ever comes from a completed exchange.
- `_bearer` returns the token or raises its _Invalid; `parse_jaas` returns an entry or raises JaasError;
  `PrincipalMapper` refuses rules it cannot apply (TlsConfigError) and maps any name of a certificate to a name or
  None without raising (it runs inside a TLS connection's setup).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.errors import ErrorCode
from oncelog.security.jaas import _FLAGS, JaasEntry, JaasError, parse_jaas
from oncelog.security.sasl.authenticator import Authenticator, State
from oncelog.security.sasl.mechanisms import AuthenticationFailed, PlainExchange, ScramExchange
from oncelog.security.sasl.oauthbearer import OAuthBearerExchange, _bearer, _Invalid
from oncelog.security.tls import PrincipalMapper, TlsConfigError
from tests.fuzz import auth_corpus as seeds
from tests.fuzz.mutate import FUZZ_SETTINGS, damaged, record_iterations

RUNS: Counter[str] = Counter()
HANDSHAKE_CODES = {ErrorCode.NONE, ErrorCode.UNSUPPORTED_SASL_MECHANISM, ErrorCode.ILLEGAL_SASL_STATE}
AUTHENTICATE_CODES = {ErrorCode.NONE, ErrorCode.ILLEGAL_SASL_STATE, ErrorCode.SASL_AUTHENTICATION_FAILED}


@pytest.fixture(scope="module", autouse=True)
def _report_iterations():
    yield
    for target, count in sorted(RUNS.items()):
        record_iterations(target, count)
    print("fuzz inputs per target:", dict(RUNS))


def _step(exchange, token: bytes) -> bytes | None:
    """The exchange's answer, or None when it refused the client; anything else raised fails the test."""
    try:
        out = exchange.step(token)
    except AuthenticationFailed as exc:
        assert str(exc)  # the client is told something
        return None
    assert isinstance(out, bytes)
    return out


# -- mechanisms -----------------------------------------------------------------------------------------------------

@FUZZ_SETTINGS
@given(damaged(seeds.plain_tokens()))
def test_plain_exchange(token):
    RUNS["sasl PLAIN exchange"] += 1
    exchange = PlainExchange(seeds.PLAIN_USERS)
    if _step(exchange, token) is not None:
        assert exchange.complete
        authzid, user, password = token.decode().split("\0")
        assert seeds.PLAIN_USERS[user] == password and authzid in ("", user)
        assert exchange.principal == f"User:{user}"


@FUZZ_SETTINGS
@given(st.sampled_from(seeds.SCRAM_MECHANISMS), st.booleans(), st.data())
def test_scram_exchange(mechanism, right_password, data):
    """An honest client-first (or a damaged one), then the client's real final message damaged: the server answers
    or refuses, and completes only for the undamaged proof of the right password."""
    RUNS["sasl SCRAM exchange"] += 1
    if data.draw(st.integers(0, 3)) == 0:
        exchange = ScramExchange(mechanism, seeds.credentials())
        token = data.draw(damaged(seeds.scram_first_messages()))
        if _step(exchange, token) is not None:
            assert not exchange.complete
            assert _step(exchange, data.draw(damaged([b"c=biws,r=x,p=AAAA"]))) is None
        return
    exchange, client, _first, server_first = seeds.scram_exchange(
        mechanism, seeds.PASSWORD if right_password else "wrong")
    client.set_server_first(server_first.decode())
    final = client.get_client_final().encode()
    token = data.draw(st.one_of(st.just(final), damaged([final])))
    out = _step(exchange, token)
    if out is not None:
        assert exchange.complete and exchange.principal == f"User:{seeds.USER}"
        assert right_password, "authenticated without the proof of the password"
        if token == final:
            client.set_server_final(out.decode())  # the server proved itself too


@FUZZ_SETTINGS
@given(st.data())
def test_oauthbearer_exchange(data):
    """The initial response damaged, then whatever the client sends after the error challenge."""
    RUNS["sasl OAUTHBEARER exchange"] += 1
    settings, messages = seeds.oauth()
    exchange = OAuthBearerExchange(settings)
    first = data.draw(damaged(messages))
    out = _step(exchange, first)
    if out is None:
        return
    if exchange.complete:  # only the token signed by the JWKS's key, not expired, names alice
        assert exchange.principal == f"User:{seeds.USER}" and exchange.credential_expires_ms > time.time() * 1000
        return
    assert out.startswith(b"{")  # RFC 7628's error challenge; the next message fails the exchange
    assert _step(exchange, data.draw(st.binary(max_size=8))) is None


@FUZZ_SETTINGS
@given(damaged(seeds.oauth()[1]))
def test_oauthbearer_message_parser(message):
    RUNS["OAUTHBEARER message parser"] += 1
    try:
        token = _bearer(message)
    except _Invalid as exc:
        assert str(exc)
        return
    assert isinstance(token, str) and token == token.strip() and token


# -- the state machine ----------------------------------------------------------------------------------------------

def _authenticator() -> Authenticator:
    settings, _ = seeds.oauth()
    mechanisms = {
        "PLAIN": lambda: PlainExchange(seeds.PLAIN_USERS),
        **{m: (lambda m=m: ScramExchange(m, seeds.credentials())) for m in seeds.SCRAM_MECHANISMS},
        "OAUTHBEARER": lambda: OAuthBearerExchange(settings),
    }
    return Authenticator(mechanisms, max_receive=4096, max_reauth_ms=0)


MECHANISM_NAMES = st.sampled_from(["PLAIN", *seeds.SCRAM_MECHANISMS, "OAUTHBEARER", "GSSAPI", "plain", "", "\x00"])
TOKENS = st.one_of(damaged(seeds.plain_tokens()), damaged(seeds.scram_first_messages()),
                   damaged(seeds.oauth()[1]), st.binary(min_size=4090, max_size=4100))
STEPS = st.lists(st.one_of(st.tuples(st.just("handshake"), MECHANISM_NAMES), st.tuples(st.just("authenticate"), TOKENS),
                           st.tuples(st.just("allows"), st.sampled_from([0, 3, 17, 18, 36, 60, -1, 9999]))),
                 max_size=8)


@FUZZ_SETTINGS
@given(STEPS)
def test_authenticator_state_machine(steps):
    RUNS["SASL state machine"] += 1
    auth = _authenticator()
    for kind, arg in steps:
        before = auth.state
        if kind == "handshake":
            code = auth.handshake(arg)
            assert code in HANDSHAKE_CODES
            assert (code == ErrorCode.NONE) == (auth.state is State.AUTHENTICATE)
        elif kind == "authenticate":
            code, message, out, lifetime = auth.authenticate(arg)
            assert code in AUTHENTICATE_CODES and isinstance(out, bytes) and lifetime >= 0
            assert (code == ErrorCode.NONE) == (message is None)
            if code != ErrorCode.NONE:
                assert auth.state is State.FAILED
            if auth.state is State.DONE and before is not State.DONE:
                assert auth.principal is not None and auth.principal.startswith("User:")
        else:
            allowed = auth.allows(arg)
            if auth.state is State.FAILED:
                assert not allowed
            elif arg not in (17, 18, 36):
                assert allowed == auth.authenticated
        if before is State.FAILED:
            assert auth.state is State.FAILED, "a failed authentication came back to life"
        if auth.authenticated:
            assert auth.principal is not None


# -- what an operator writes ----------------------------------------------------------------------------------------

JAAS_INPUTS = st.one_of(damaged([t.encode() for t in seeds.JAAS_TEXTS]).map(lambda b: b.decode("latin-1")),
                        st.text(max_size=80))


@FUZZ_SETTINGS
@given(JAAS_INPUTS)
def test_jaas_parser(text):
    RUNS["JAAS parser"] += 1
    try:
        entry = parse_jaas(text, "listener.name.x.plain.sasl.jaas.config")
    except JaasError as exc:
        assert "listener.name.x.plain.sasl.jaas.config" in str(exc)
        return
    assert isinstance(entry, JaasEntry) and entry.flag in _FLAGS and entry.module
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in entry.options.items())
    assert "secret" not in repr(entry)  # options hold passwords: never printed


def _text(seed_list: list[str]) -> st.SearchStrategy:
    return st.one_of(damaged([s.encode() for s in seed_list]).map(lambda b: b.decode("latin-1")),
                     st.text(max_size=40))


# Rules assembled from the parts of Kafka's syntax (regexes with and without groups, replacements with group
# references, escapes and literal text, a case flag), so most parse and then meet names their regexes match.
_RULE = st.one_of(st.just("DEFAULT"), st.builds(
    "RULE:{}/{}/{}".format,
    st.sampled_from(["^CN=(.*?),OU=(.*)$", "^(.*)$", "^CN=([^,]*).*$", ".*", "^cn=(.?),ou=(.?).*$", "(a)|(b)",
                     "^CN=(?P<n>[a-z]+)$"]),
    st.lists(st.sampled_from(["$0", "$1", "$2", "$3", "$12", "$", "x", "\\", "\\$", "\\\\", "@", "\\/", "\\g<1>",
                              "{", "\\n"]), max_size=4).map("".join),
    st.sampled_from(["", "L", "U"])))
RULES = st.one_of(_text(seeds.MAPPING_RULES), st.lists(_RULE, min_size=1, max_size=3).map(",".join))
NAMES = st.one_of(_text(seeds.DISTINGUISHED_NAMES), st.sampled_from(["a", "b", "CN=x", "cn=a,ou=b,dc=c"]))


@FUZZ_SETTINGS
@given(RULES, st.lists(NAMES, min_size=1, max_size=4))
def test_principal_mapping_rules(rules, names):
    RUNS["ssl.principal.mapping.rules"] += 1
    try:
        mapper = PrincipalMapper(rules)
    except TlsConfigError as exc:
        assert "ssl.principal.mapping.rules" in str(exc)
        return
    for name in names:
        out = mapper.name(name)  # runs when a client's certificate arrives: it must not raise
        assert out is None or isinstance(out, str)
