"""Coverage-guided fuzzing of the broker's decoders and its authentication path with atheris (libFuzzer), for
`make fuzz`.

`python -m tests.fuzz.atheris_fuzz [--seconds N] [TARGET ...]` runs each target (default: all) in its own
process for N seconds, starting from the valid seeds of `corpus.py` and `auth_corpus.py`, and prints the runs and
any crash. A crash is an exception outside the function's contract (the same contracts as test_fuzz_decoders.py and
test_fuzz_auth.py); libFuzzer writes the input to crash-<hash> in the working directory, and it belongs in
test_fuzz_regressions.py.
Checksummed formats get their checksum recomputed, so mutations reach the parsers behind it.
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import crc32c

    from oncelog.config import load_broker_config, parse_topic_overrides
    from oncelog.coordinator.group import records as group_records
    from oncelog.coordinator.txn import log_format
    from oncelog.protocol.fetch_codec import decode_fetch_request
    from oncelog.protocol.header import decode_request_header
    from oncelog.protocol.messages import decode_request
    from oncelog.protocol.primitives import ProtocolError
    from oncelog.protocol.produce_codec import decode_produce_request
    from oncelog.records.batch import HEADER_SIZE, LOG_OVERHEAD, crc_ok, read_header, rewrite_crc
    from oncelog.records.control import ControlRecordError, parse_marker
    from oncelog.records.reader import CorruptRecordsError, read_batches
    from oncelog.records.validate import validate_produce
    from oncelog.security.jaas import JaasError, parse_jaas
    from oncelog.security.sasl.authenticator import Authenticator
    from oncelog.security.sasl.mechanisms import AuthenticationFailed, PlainExchange, ScramExchange
    from oncelog.security.sasl.oauthbearer import OAuthBearerExchange, _bearer, _Invalid
    from oncelog.security.tls import PrincipalMapper, TlsConfigError
    from oncelog.storage.producer_state import decode_snapshot

from tests.fuzz import auth_corpus, corpus

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = corpus.request_bodies()
API_VERSIONS = sorted(REQUESTS)
_BROKER = load_broker_config()
TOPIC_CONFIGS = [
    _BROKER.topic_config(),
    _BROKER.topic_config(parse_topic_overrides({"cleanup.policy": "compact"})),
    _BROKER.topic_config(parse_topic_overrides({"message.timestamp.before.max.ms": "3600000"})),
]


def _request_input(data: bytes) -> tuple[int, int, bytes]:
    """First byte picks the API and version, the rest is the body."""
    if not data:
        return (*API_VERSIONS[0], b"")
    return (*API_VERSIONS[data[0] % len(API_VERSIONS)], data[1:])


def fuzz_requests(data: bytes) -> None:
    api_key, version, body = _request_input(data)
    try:
        decode_request_header(corpus.frame(api_key, version, body), bool(data[:1] and data[0] & 0x80))
        if api_key == 0:
            decode_produce_request(memoryview(body), version)
        elif api_key == 1:
            decode_fetch_request(memoryview(body), version)
        else:
            decode_request(api_key, version, memoryview(body))
    except ProtocolError:
        pass


def _fixed_batch(data: bytes) -> bytearray:
    buf = bytearray(data[1:])
    if data[:1] and data[0] & 1 and len(buf) >= HEADER_SIZE:
        try:
            rewrite_crc(buf, 0, min(read_header(buf).length + LOG_OVERHEAD, len(buf)))
        except (struct.error, ValueError):
            pass
    return buf


def fuzz_batches(data: bytes) -> None:
    buf = _fixed_batch(data)
    config = TOPIC_CONFIGS[(data[0] >> 1) % len(TOPIC_CONFIGS)] if data else TOPIC_CONFIGS[0]
    result = validate_produce(bytearray(buf), config, 1_700_000_000_000, api_version=11,
                              walk_records=bool(data[:1] and data[0] & 0x40))
    if result.ok and not crc_ok(buf, 0, read_header(buf)):
        raise AssertionError("accepted a batch whose CRC does not match")
    try:
        read_batches(bytes(buf))
    except CorruptRecordsError:
        pass
    try:
        parse_marker(bytes(buf))
    except ControlRecordError:
        pass


def fuzz_state(data: bytes) -> None:
    """Producer-state snapshots, transaction-log and group-log records: what a restart reads back."""
    kind, body = (data[0] % 5, data[1:]) if data else (0, b"")
    try:
        if kind == 0:
            buf = bytearray(body)
            if len(buf) >= 6:
                struct.pack_into(">I", buf, 2, crc32c.crc32c(bytes(buf[6:])))
            decode_snapshot(bytes(buf))
        elif kind == 1:
            log_format.decode_key(body)
            log_format.decode_value("tx", body)
        elif kind == 2:
            group_records.decode_key(body)
        elif kind == 3:
            group_records.decode_offset_value(body)
        else:
            group_records.decode_group_value(body)
    except (ValueError, ProtocolError):
        pass  # RecordFormatError is a ValueError; the snapshot reader raises ValueError


def _step(exchange, token: bytes) -> None:
    try:
        exchange.step(token)
    except AuthenticationFailed:
        pass


def _authenticator() -> Authenticator:
    settings = auth_corpus.oauth()[0]
    return Authenticator({"PLAIN": lambda: PlainExchange(auth_corpus.PLAIN_USERS),
                          "SCRAM-SHA-256": lambda: ScramExchange("SCRAM-SHA-256", auth_corpus.credentials()),
                          "OAUTHBEARER": lambda: OAuthBearerExchange(settings)}, 4096, 0)


def fuzz_auth(data: bytes) -> None:
    """The authentication path (the same contracts as test_fuzz_auth.py): the first byte picks the target, NUL
    separates the parts of inputs that have two (a SCRAM exchange's two messages, rules and a name, a mechanism
    and the tokens of a SASL conversation)."""
    kind, body = (data[0] % 7, data[1:]) if data else (0, b"")
    first, _, rest = body.partition(b"\x00")
    if kind == 0:
        _step(PlainExchange(auth_corpus.PLAIN_USERS), body)
    elif kind == 1:
        exchange = ScramExchange("SCRAM-SHA-256", auth_corpus.credentials())
        _step(exchange, first)
        _step(exchange, rest)
    elif kind == 2:
        exchange = OAuthBearerExchange(auth_corpus.oauth()[0])
        _step(exchange, body)
        _step(exchange, b"\x01")
    elif kind == 3:
        try:
            _bearer(body)
        except _Invalid:
            pass
    elif kind == 4:
        try:
            parse_jaas(body.decode("latin-1"))
        except JaasError:
            pass
    elif kind == 5:
        try:
            mapper = PrincipalMapper(first.decode("latin-1"))
        except TlsConfigError:
            return
        mapper.name(rest.decode("latin-1"))
    else:
        auth = _authenticator()
        auth.handshake(first.decode("latin-1"))
        for token in rest.split(b"\x00\x00"):
            auth.authenticate(token)
            auth.allows(3)


def _seeds(target: str) -> list[bytes]:
    if target == "auth":
        scram = [first + b"\x00c=biws,r=x,p=AAAA" for first in auth_corpus.scram_first_messages()]
        rules = [r.encode() + b"\x00" + n.encode() for r in auth_corpus.MAPPING_RULES
                 for n in auth_corpus.DISTINGUISHED_NAMES]
        return ([b"\x00" + t for t in auth_corpus.plain_tokens()] + [b"\x01" + m for m in scram]
                + [b"\x02" + m for m in auth_corpus.oauth()[1]] + [b"\x03" + m for m in auth_corpus.oauth()[1]]
                + [b"\x04" + t.encode() for t in auth_corpus.JAAS_TEXTS] + [b"\x05" + r for r in rules]
                + [b"\x06PLAIN\x00" + t for t in auth_corpus.plain_tokens()]
                + [b"\x06SCRAM-SHA-256\x00" + m for m in scram])
    if target == "requests":
        return [bytes([i]) + body for i, key in enumerate(API_VERSIONS) for body in REQUESTS[key]]
    if target == "batches":
        return [bytes([flag]) + batch for batch in corpus.record_batches() for flag in (0, 1, 0x41)]
    txn_keys, txn_values = corpus.txn_log_records()
    keys, offsets, groups = corpus.group_log_records()
    return ([b"\x00" + s for s in corpus.snapshots()] + [b"\x01" + v for v in txn_keys + txn_values]
            + [b"\x02" + k for k in keys] + [b"\x03" + v for v in offsets] + [b"\x04" + v for v in groups])


TARGETS = {"requests": fuzz_requests, "batches": fuzz_batches, "state": fuzz_state, "auth": fuzz_auth}


def run_one(target: str, libfuzzer_args: list[str]) -> None:
    """In the child process: fuzz one target until libFuzzer stops."""
    atheris.Setup([sys.argv[0], *libfuzzer_args], TARGETS[target])
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("targets", nargs="*", default=list(TARGETS))
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child:
        run_one(args.child, rest)
        return 0
    failed = []
    total = 0
    for target in args.targets:
        with tempfile.TemporaryDirectory(prefix=f"oncelog-atheris-{target}-") as tmp:
            seeds = Path(tmp) / "seeds"
            work = Path(tmp) / "corpus"
            seeds.mkdir()
            work.mkdir()
            for i, seed in enumerate(_seeds(target)):
                (seeds / f"seed-{i}").write_bytes(seed)
            cmd = [sys.executable, "-m", "tests.fuzz.atheris_fuzz", "--child", target,
                   f"-max_total_time={args.seconds}", "-rss_limit_mb=4096", "-print_final_stats=1",
                   str(work), str(seeds)]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        output = done.stdout + done.stderr
        runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output)
        count = int(runs[-1]) if runs else 0
        total += count
        crashed = done.returncode != 0
        print(f"atheris {target}: {count} inputs, {'CRASH' if crashed else 'no crash'}", flush=True)
        if crashed:
            failed.append(target)
            print("\n".join(output.splitlines()[-40:]))
    print(f"atheris total: {total} inputs, crashes in: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
