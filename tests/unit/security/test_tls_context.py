"""A listener's SSLContext follows ssl.protocol and ssl.enabled.protocols (security/tls.py)."""

from __future__ import annotations

import ssl

import pytest
from tests.support.kafka import TlsMaterial

from oncelog.security.tls import TlsConfigError, server_context


def settings(tls: TlsMaterial, **overrides) -> dict:
    base = {"ssl.enabled.protocols": ["TLSv1.2", "TLSv1.3"], "ssl.protocol": "TLSv1.3", "ssl.cipher.suites": [],
            "ssl.keystore.location": str(tls.broker_keystore_pem), "ssl.keystore.certificate.chain": "",
            "ssl.keystore.key": "", "ssl.key.password": "", "ssl.client.auth": "none",
            "ssl.truststore.location": "", "ssl.truststore.certificates": ""}
    return {**base, **overrides}


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsMaterial:
    return TlsMaterial(tmp_path_factory.mktemp("tls"))


def test_ssl_protocol_caps_the_versions_offered(tls):
    both = server_context(settings(tls))
    assert (both.minimum_version, both.maximum_version) == (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)
    capped = server_context(settings(tls, **{"ssl.protocol": "TLSv1.2"}))
    assert (capped.minimum_version, capped.maximum_version) == (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2)


def test_enabled_protocols_above_ssl_protocol_are_refused(tls):
    with pytest.raises(TlsConfigError, match="none at or below ssl.protocol"):
        server_context(settings(tls, **{"ssl.protocol": "TLSv1.2", "ssl.enabled.protocols": ["TLSv1.3"]}))
