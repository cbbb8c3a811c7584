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


_SECTION = re.compile(r"\s*([A-Za-z0-9_.$-]+)\s*\{")


def _without_comments(text: str) -> str:
    """A JAAS file's text without `//`, `#` and `/* */` comments (quoted values kept whole)."""
    out, pos, quoted = [], 0, False
    while pos < len(text):
        char = text[pos]
        if quoted:
            out.append(char)
            if char == "\\" and pos + 1 < len(text):
                out.append(text[pos + 1])
                pos += 1
            elif char == '"':
                quoted = False
            pos += 1
        elif char == '"':
            quoted = True
            out.append(char)
            pos += 1
        elif text.startswith("/*", pos):
            end = text.find("*/", pos + 2)
            pos = len(text) if end < 0 else end + 2
            out.append(" ")
        elif text.startswith("//", pos) or char == "#":
            end = text.find("\n", pos)
            pos = len(text) if end < 0 else end
        else:
            out.append(char)
            pos += 1
    return "".join(out)


def _split_outside_quotes(text: str, stop: str, start: int) -> tuple[list[str], int]:
    """The `;`-terminated pieces of `text` from `start` up to the first unquoted `stop` character, and the index
    after it (-1 when there is none)."""
    pieces, piece, pos, quoted = [], [], start, False
    while pos < len(text):
        char = text[pos]
        if quoted:
            piece.append(char)
            if char == "\\" and pos + 1 < len(text):
                piece.append(text[pos + 1])
                pos += 1
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
            piece.append(char)
        elif char == stop:
            if "".join(piece).strip():
                pieces.append("".join(piece))
            return pieces, pos + 1
        elif char == ";":
            pieces.append("".join(piece) + ";")
            piece = []
        else:
            piece.append(char)
        pos += 1
    return pieces, -1


def parse_jaas_file(text: str, source: str = "JAAS file") -> dict[str, list[JaasEntry]]:
    """The sections of a JAAS login configuration file (what Java's `java.security.auth.login.config` names):

        Client {
            org.apache.zookeeper.server.auth.DigestLoginModule required username="broker" password="secret";
        };

    section name -> its login modules in order, each parsed as `parse_jaas` parses one. JaasError names `source`
    and the section when the file cannot be read."""
    text = _without_comments(text)
    sections: dict[str, list[JaasEntry]] = {}
    pos = 0
    while text[pos:].strip():
        match = _SECTION.match(text, pos)
        if match is None:
            raise JaasError(f"{source}: expected '<Section name> {{' near {text[pos:].strip()[:20]!r}")
        name = match.group(1)
        pieces, end = _split_outside_quotes(text, "}", match.end())
        if end < 0:
            raise JaasError(f"{source}: section {name} has no closing '}}'")
        if any(not piece.rstrip().endswith(";") for piece in pieces):
            raise JaasError(f"{source}: section {name}: every login module must end with ';'")
        semicolon = re.compile(r"\s*;").match(text, end)
        if semicolon is None:
            raise JaasError(f"{source}: section {name} must end with '}};'")
        if name in sections:
            raise JaasError(f"{source}: section {name} appears twice")
        sections[name] = [parse_jaas(piece, f"{source} section {name}") for piece in pieces]
        pos = semicolon.end()
    return sections
