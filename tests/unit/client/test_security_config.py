"""Security settings are decided when a client is built: Kafka's key names, Java's spellings, and every mistake
a ValueError naming the key. (The exchanges themselves are tested against Apache Kafka in tests/kafka.)"""

from __future__ import annotations

import ssl

import pytest

from oncelog.client.config import ClientConfig
from oncelog.client.sasl import reauthentication_delay
from oncelog.client.security import security_from_config


def _security(**conf):
    return security_from_config(ClientConfig({"bootstrap.servers": "h:1", **conf}, "producer"))


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory):
    trustme = pytest.importorskip("trustme")
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    path.write_bytes(trustme.CA().cert_pem.bytes())
    return str(path)


def test_plaintext_is_the_default():
    security = _security()
    assert (security.protocol, security.ssl_context, security.sasl) == ("PLAINTEXT", None, None)


def test_protocol_names_are_case_insensitive(ca_file):
    security = _security(**{"security.protocol": "sasl_ssl", "ssl.ca.location": ca_file,
                            "sasl.mechanisms": "scram-sha-256", "sasl.username": "u", "sasl.password": "p"})
    assert security.protocol == "SASL_SSL"
    assert security.sasl.mechanism == "SCRAM-SHA-256"
    assert security.ssl_context.verify_mode == ssl.CERT_REQUIRED and security.ssl_context.check_hostname


def test_endpoint_identification_none_keeps_certificate_checks(ca_file):
    ctx = _security(**{"security.protocol": "SSL", "ssl.ca.location": ca_file,
                       "ssl.endpoint.identification.algorithm": ""}).ssl_context
    assert not ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED


def test_jaas_config_gives_the_credentials(ca_file):
    sasl = _security(**{
        "security.protocol": "SASL_SSL", "ssl.ca.location": ca_file, "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                            'username="svc" password="s\\"cret";'}).sasl
    assert (sasl.username, sasl.password) == ("svc", 's"cret')
    assert "cret" not in repr(sasl)


def test_secrets_are_not_printed():
    config = ClientConfig({"bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT",
                           "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "hunter2"}, "admin")
    assert "hunter2" not in repr(config)


@pytest.mark.parametrize(("conf", "phrase"), [
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "GSSAPI is not supported"),
    ({"security.protocol": "SASL_PLAINTEXT"}, "GSSAPI is not supported"),  # Kafka's default mechanism
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u"}, "sasl.password"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}, "needs a token"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
      "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\";"},
     "does not do sasl.mechanism SCRAM-SHA-512"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token": "t",
      "sasl.oauthbearer.extensions": "auth=x"}, "sasl.oauthbearer.extensions"),
    ({"sasl.mechanism": "PLAIN"}, "security.protocol is PLAINTEXT"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}, "ssl.ca.location: no such file"),
    ({"security.protocol": "SSL", "ssl.key.location": "/k.pem"}, "without ssl.certificate.location"),
    ({"security.protocol": "SSL", "ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/k.p12"},
     "PEM key stores only"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldap"}, "https or none"),
])
def test_mistakes_name_the_key(conf, phrase):
    with pytest.raises(ValueError) as info:
        _security(**conf)
    assert phrase in str(info.value)


def test_unknown_protocol_is_refused():
    with pytest.raises(ValueError, match="security.protocol"):
        _security(**{"security.protocol": "TLS"})


def test_oauth_cb_must_be_callable():
    with pytest.raises(ValueError, match="oauth_cb"):
        _security(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": "x"})


def test_reauthentication_happens_before_the_session_ends():
    assert reauthentication_delay(10_000, 0.0) == pytest.approx(8.5)
    assert reauthentication_delay(10_000, 0.999) < 9.5


def test_a_garbled_sasl_answer_is_a_network_error_not_a_crash():
    """The SASL exchange decodes the broker's bytes itself: a broken stream must close the connection the way a
    garbled answer to any other request does (NetworkError), not escape as a decoder exception."""
    import asyncio

    from oncelog.client.errors import NetworkError
    from oncelog.client.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE, authenticate
    from oncelog.client.security import SaslCredentials

    async def garbage(api_key: int, version: int, body: bytes) -> memoryview:
        return memoryview(b"\x00")

    creds = SaslCredentials("PLAIN", username="u", password="p")
    versions = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
    with pytest.raises(NetworkError, match="undecodable SASL response"):
        asyncio.run(authenticate(creds, versions, "h:1", garbage))
