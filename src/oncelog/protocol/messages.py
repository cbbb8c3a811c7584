"""The long tail of APIs through kafka-python's schema-driven codecs, behind one module.

Everything outside the hot path (Produce, Fetch) is decoded and encoded here, so the
library can be swapped without touching handlers. Handlers describe responses as
plain dicts keyed by the schema's snake_case field names; `encode_response` turns
them into the library's nested containers.
"""

from __future__ import annotations

from typing import Any

import kafka.protocol.admin as _admin
import kafka.protocol.consumer as _consumer
import kafka.protocol.metadata as _metadata
import kafka.protocol.producer as _producer
import kafka.protocol.sasl as _sasl

from . import inter_broker as _inter_broker
from .primitives import ProtocolError

REQUESTS: dict[int, Any] = {}
RESPONSES: dict[int, Any] = {}
for _module in (_admin, _consumer, _metadata, _producer, _sasl, _inter_broker):
    for _name in _module.__all__:
        _cls = getattr(_module, _name)
        if hasattr(_cls, "API_KEY") and hasattr(_cls, "json"):
            if _name.endswith("Request"):
                REQUESTS[_cls.API_KEY] = _cls
            elif _name.endswith("Response"):
                RESPONSES[_cls.API_KEY] = _cls


def decode_request(api_key: int, version: int, body: memoryview) -> Any:
    """Decode a request body; any malformation becomes a ProtocolError."""
    cls = REQUESTS.get(api_key)
    if cls is None:
        raise ProtocolError(f"no codec for API key {api_key}")
    try:
        message = cls.decode(body, version=version)
    except ProtocolError:
        raise
    except Exception as exc:  # the library raises IndexError/ValueError/struct.error on bad input
        raise ProtocolError(f"malformed {cls.__name__} v{version}: {exc!r}") from None
    _check_nulls(cls._struct, message, version, cls.__name__)
    return message


def _check_nulls(struct: Any, value: Any, version: int, where: str) -> None:
    """Reject null where the schema does not allow it (the library decodes a -1 length as None anyway),
    so handlers can trust every array and string they iterate."""
    for name, field in struct.fields.items():
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        item = getattr(value, name, None)
        if item is None:
            if (field.is_array() or field.type_str in ("string", "bytes")) and \
                    not field.nullable_for_version_q(version):
                raise ProtocolError(f"malformed {where} v{version}: null {name}")
            continue
        if field.is_struct_array():
            for element in item:
                _check_nulls(field, element, version, where)
        elif field.is_struct():
            _check_nulls(field, item, version, where)
        elif field.type_str in ("[]string", "[]bytes") and any(element is None for element in item):
            # the elements of an array are never nullable in Kafka's schemas (the library decodes them anyway)
            raise ProtocolError(f"malformed {where} v{version}: null element in {name}")


def _build(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    fields = cls._struct.fields
    values = {}
    for name, value in data.items():
        field = fields.get(name)
        if field is None:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        if value is not None and field.is_struct_array():
            value = [_build(field.data_class, item) for item in value]
        elif value is not None and field.is_struct():
            value = _build(field.data_class, value)
        values[name] = value
    return cls(**values)


def encode_response(api_key: int, version: int, data: dict[str, Any]) -> bytes:
    """Encode a response body (no header) from a dict of snake_case schema fields."""
    cls = RESPONSES[api_key]
    message = _build(cls[version], data)
    return bytes(message.encode(version=version))
