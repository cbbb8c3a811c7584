"""Seeds and fixtures for fuzzing the authentication path: what a client sends before it is authenticated (SASL
tokens of PLAIN, SCRAM and OAUTHBEARER, the SASL requests themselves) and what an operator writes that decides who a
client is (JAAS configs, ssl.principal.mapping.rules, certificate names).

Valid messages come from independent implementations: scramp's client for SCRAM, PyJWT for tokens; the credential
store and JWKS are built once per process (PBKDF2 and an RSA key take a moment).
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from oncelog.security.credentials import from_password

USER, PASSWORD = "alice", "alice-secret"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
PLAIN_USERS = {USER: PASSWORD, "bob": "bob-secret"}


class Credentials:
    """A CredentialStore with alice's SCRAM credentials (4096 iterations, Kafka's minimum)."""

    def __init__(self) -> None:
        self._credentials = {m: from_password(m, PASSWORD) for m in SCRAM_MECHANISMS}

    def get(self, user: str, mechanism: str) -> Any:
        return self._credentials.get(mechanism) if user == USER else None

    def describe(self) -> dict:
        return {}

    def alter(self, upserts: Any, deletions: Any) -> None:
        raise NotImplementedError


@functools.cache
def credentials() -> Credentials:
    return Credentials()


def plain_tokens() -> list[bytes]:
    return [f"\0{USER}\0{PASSWORD}".encode(), f"{USER}\0{USER}\0{PASSWORD}".encode(), b"\0bob\0wrong",
            b"\0\0", b"a\0b\0c\0d"]


@functools.cache
def scram_first_messages() -> list[bytes]:
    from scramp import ScramClient

    out = []
    for mechanism in SCRAM_MECHANISMS:
        out.append(ScramClient([mechanism], USER, PASSWORD).get_client_first().encode())
    out += [b"n,,n=alice,r=abc", b"y,,n=alice,r=abc", b"n,a=alice,n=alice,r=abc", b"p=tls-unique,,n=a,r=b",
            b"n,,n=al=2Cice,r=x,ext=1"]
    return out


def scram_exchange(mechanism: str, password: str = PASSWORD) -> tuple[Any, Any, bytes, bytes]:
    """(server exchange, client, client-first, server-first) of one SCRAM exchange started honestly."""
    from scramp import ScramClient

    from oncelog.security.sasl.mechanisms import ScramExchange

    client = ScramClient([mechanism], USER, password)
    server = ScramExchange(mechanism, credentials())
    first = client.get_client_first().encode()
    return server, client, first, server.step(first)


@functools.cache
def oauth() -> tuple[Any, list[bytes]]:
    """(OAuthSettings over a JWKS file of one RSA key, seed messages: a valid token, an expired one, one signed by
    another key, unsigned)."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    from oncelog.security.sasl.oauthbearer import JwksKeys, OAuthSettings

    key, stranger = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk["kid"] = "k1"
    directory = Path(tempfile.mkdtemp(prefix="oncelog-fuzz-jwks-"))
    (directory / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    settings = OAuthSettings(JwksKeys(str(directory / "jwks.json"), 3_600_000), audience=("kafka",))
    now = int(time.time())
    tokens = [
        jwt.encode({"sub": USER, "exp": now + 3600, "aud": "kafka"}, key, "RS256", headers={"kid": "k1"}),
        jwt.encode({"sub": USER, "exp": now - 3600, "aud": "kafka"}, key, "RS256", headers={"kid": "k1"}),
        jwt.encode({"sub": USER, "exp": now + 3600, "aud": "kafka"}, stranger, "RS256", headers={"kid": "k1"}),
        jwt.encode({"sub": USER, "exp": now + 3600}, None, "none"),
    ]
    messages = [f"n,,\x01auth=Bearer {t}\x01\x01".encode() for t in tokens]
    messages += [b"n,a=alice,\x01host=h\x01port=1\x01auth=Bearer x.y.z\x01\x01", b"\x01", b""]
    return settings, messages


JAAS_TEXTS = [
    'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" '
    'user_bob="b\\"o\\\\b";',
    'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="pw";',
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule optional unsecuredLoginStringClaim_sub=x;",
    "x sufficient;",
]

MAPPING_RULES = [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2\\/$3/U, DEFAULT",
    "RULE:^(.*)$/x\\$\\\\$1/",
]

DISTINGUISHED_NAMES = [
    "CN=alice,OU=ServiceUsers,O=Example,L=Here,ST=There,C=US",
    "CN=kafka1,OU=Brokers",
    "cn=a,ou=b,dc=c,dc=d",
    "CN=Duke\\, Jr.,O=Sun\\+Moon,C=US",
    "",
]
