"""Kafka's `sasl.jaas.config` values: `<LoginModule class> <flag> key="value" ... ;`.

A broker reads its PLAIN users (`user_<name>="<password>"`) and its own inter-broker credential
(`username`, `password`) from the listener's JAAS config, so the syntax is parsed properly (quoted values with
escapes, unquoted values, the closing `;`) rather than picked out with a pattern, and a malformed value stops
the broker with the key's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_FLAGS = ("required", "requisite", "sufficient", "optional")
_TOKEN = re.compile(r'\s*(?:(;)|([A-Za-z0-9_.$-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))|([A-Za-z0-9_.$]+))')


class JaasError(ValueError):
    """A JAAS config that cannot be read; the message names the key."""


@dataclass(frozen=True)
class JaasEntry:
    module: str
    flag: str
    options: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # options hold passwords: never print them
        return f"JaasEntry({self.module!r}, {self.flag!r}, keys={sorted(self.options)})"


def parse_jaas(text: str, key: str = "sasl.jaas.config") -> JaasEntry:
    """The single login module of a Kafka JAAS config value (Kafka allows exactly one per value)."""
    pos, words, options, closed = 0, [], {}, False
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or closed:
            raise JaasError(f"{key}: cannot parse the JAAS config near {text[pos:pos + 20]!r} (expected "
                            '<LoginModule> required key="value" ... ;)')
        pos = match.end()
        if match.group(1):
            closed = True
        elif match.group(2):
            value = match.group(3) if match.group(3) is not None else match.group(4)
            options[match.group(2)] = re.sub(r"\\(.)", r"\1", value)
        else:
            if options:
                raise JaasError(f"{key}: options come after the login module and its flag")
            words.append(match.group(5))
    if not closed:
        raise JaasError(f"{key}: the JAAS config must end with ';'")
    if len(words) != 2 or words[1].lower() not in _FLAGS:
        raise JaasError(f"{key}: expected '<LoginModule class> required|requisite|sufficient|optional', got "
                        f"{' '.join(words)!r}")
    return JaasEntry(words[0], words[1].lower(), options)
