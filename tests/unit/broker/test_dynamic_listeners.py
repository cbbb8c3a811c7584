"""broker/dynamic_listeners.py without a broker: which keys are dynamic and what Kafka's preprocessing refuses, the
file a single node keeps them in, and a cluster broker's refusal."""

from __future__ import annotations

import json
import os
import stat

import pytest
from tests.support.kafka import TlsMaterial

from oncelog.broker.dynamic_listeners import (
    DYNAMIC_SSL_KEYS,
    DynamicListenerConfigs,
    check_broker_change,
    dynamic_listener_key,
)
from oncelog.broker.security_layer import SecurityConfigError
from oncelog.config import load_broker_config
from oncelog.errors import ErrorCode, KafkaError
from oncelog.security.listeners import listener_specs

SET, DELETE, APPEND = 0, 1, 2
KEY = "listener.name.ssl.ssl.keystore.location"


def test_exactly_the_reconfigurable_ssl_keys_are_dynamic_and_only_per_listener():
    assert dynamic_listener_key(KEY) == ("ssl", "ssl.keystore.location")
    assert all(dynamic_listener_key(f"listener.name.x.{k}") for k in DYNAMIC_SSL_KEYS)
    for static in ("listener.name.ssl.ssl.client.auth", "listener.name.ssl.ssl.cipher.suites",
                   "listener.name.x.plain.sasl.jaas.config", "ssl.keystore.location", "log.retention.ms"):
        assert dynamic_listener_key(static) is None
    assert check_broker_change(KEY, SET, "0") is True
    assert check_broker_change("log.retention.ms", SET, "0") is False
    for name, op, resource, code, message in [
        ("ssl.keystore.location", SET, "0", ErrorCode.INVALID_REQUEST, "only per-listener using the listener prefix"),
        (KEY, SET, "", ErrorCode.INVALID_REQUEST, "default cluster level, broker id must be specified"),
        (KEY, APPEND, "0", ErrorCode.INVALID_CONFIG, "append/subtract is not allowed"),
    ]:
        with pytest.raises(KafkaError) as refused:
            check_broker_change(name, op, resource)
        assert refused.value.code == code and message in refused.value.message


def _configs(tmp_path, cluster: bool = False) -> tuple[DynamicListenerConfigs, TlsMaterial]:
    tls = TlsMaterial(tmp_path / "tls")
    config = load_broker_config(overrides=[
        "listeners=PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", f"ssl.keystore.location={tls.broker_keystore_pem}"])
    specs = listener_specs(config.values)
    return DynamicListenerConfigs(tmp_path / "meta" / "dynamic-broker-configs.json", specs, config.values,
                                  cluster), tls


def test_a_change_is_kept_owner_only_and_read_back(tmp_path):
    dynamic, tls = _configs(tmp_path)
    plan = dynamic.prepare([(KEY, SET, str(tls.broker_keystore_pem))])
    dynamic.commit(plan)
    path = tmp_path / "meta" / "dynamic-broker-configs.json"
    assert json.loads(path.read_text()) == {"version": 1, "configs": {KEY: str(tls.broker_keystore_pem)}}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again, _ = _configs(tmp_path)
    assert again.values == {KEY: str(tls.broker_keystore_pem)}
    assert again.overlay()[KEY] == str(tls.broker_keystore_pem)


def test_the_file_at_start(tmp_path, caplog):
    path = tmp_path / "meta" / "dynamic-broker-configs.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "configs": {
        "listener.name.plaintext.ssl.keystore.location": "/x", "listener.name.gone.ssl.keystore.location": "/x",
        "log.retention.ms": "1"}}))
    dynamic, _ = _configs(tmp_path)
    assert dynamic.values == {}  # nothing that applies to this broker's TLS listeners: ignored, with a warning
    assert "ignoring listener.name.gone.ssl.keystore.location" in caplog.text
    path.write_text(json.dumps({"version": 1, "configs": {KEY: str(tmp_path / "missing.pem")}}))
    with pytest.raises(SecurityConfigError, match="no such file.*a dynamic config.*dynamic-broker-configs.json"):
        _configs(tmp_path)
    path.write_text("{not json")
    with pytest.raises(SecurityConfigError, match="cannot read the dynamic broker configs"):
        _configs(tmp_path)


def test_a_cluster_broker_refuses_them_for_now(tmp_path):
    dynamic, tls = _configs(tmp_path, cluster=True)
    with pytest.raises(KafkaError) as refused:
        dynamic.prepare([(KEY, SET, str(tls.broker_keystore_pem))])
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    assert "not supported on a cluster broker yet" in refused.value.message
