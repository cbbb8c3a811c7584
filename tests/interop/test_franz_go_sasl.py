"""franz-go's own kgo tests with SASL pointed at oncelog (issue 23: "its SASL tests run instead of skipping").

franz-go's pkg/kgo test suite reads its broker settings from the environment (helpers_test.go): KGO_SEEDS (the
broker, default 127.0.0.1:9092), KGO_TEST_SCRAM ("user:pass" or "user:pass:512"; SCRAM-SHA-256 unless 512),
KGO_TEST_SCRAM_SEEDS (the SASL listener the SCRAM tests dial), KGO_TEST_OAUTH_SEEDS, KGO_TEST_TLS. Its SASL tests
are TestSCRAMAuth (log in, Ping, a Metadata request), TestSCRAMAuthBadCredentials (an unknown user must fail) and
TestOAuthAuth; without those variables each skips. They dial the SCRAM seeds without TLS (the suite's TLS
config is only for KGO_SEEDS clients), so they point at a SecuredBroker's SASL_PLAINTEXT listener, once with
SCRAM-SHA-256 and once with SCRAM-SHA-512. TestOAuthAuth stays skipped: it sends unsecured ("alg":"none")
tokens, which only Kafka's unsecured validator accepts, and oncelog has none (README, "Broker security").

The module comes from the Go module proxy at the pinned version (`go mod download`, then the tests run in the
module cache with `go test -json`); without `go`, or when the module cannot be fetched, the tests skip with the
reason. The first run compiles the package's tests (about 40 s on two cores); later runs use Go's build cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.support.kafka import TlsMaterial
from tests.support.secured_broker import SecuredBroker

# Out of make test's time budget (make interop-test runs it); its short sibling stays in make test.
pytestmark = pytest.mark.interop_slow

FRANZ_GO = "github.com/twmb/franz-go"
FRANZ_GO_VERSION = "v1.22.3"
SASL_TESTS = ("TestSCRAMAuth", "TestSCRAMAuthBadCredentials")
GO_TEST_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def kgo_dir() -> Path:
    """franz-go's pkg/kgo in the module cache, or a skip with the reason."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("franz-go's kgo tests: no `go` on PATH")
    try:
        proc = subprocess.run([go, "mod", "download", "-json", f"{FRANZ_GO}@{FRANZ_GO_VERSION}"],
                              capture_output=True, text=True, timeout=180, env=go_env())
    except subprocess.TimeoutExpired:
        pytest.skip(f"franz-go's kgo tests: `go mod download {FRANZ_GO}@{FRANZ_GO_VERSION}` took over 180 s")
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        reason = info.get("Error") or proc.stderr.strip() or proc.stdout.strip()
        pytest.skip(f"franz-go's kgo tests: {FRANZ_GO}@{FRANZ_GO_VERSION} not available: {reason[:300]}")
    return Path(info["Dir"]) / "pkg" / "kgo"


def go_env(**extra: str) -> dict[str, str]:
    # GOTOOLCHAIN=local: never fetch another Go toolchain; a Go older than the module's go line fails the build
    return {**os.environ, "GOTOOLCHAIN": "local", **extra}


@pytest.fixture(scope="module")
def broker(kgo_dir, tmp_path_factory):
    tls = TlsMaterial(tmp_path_factory.mktemp("tls"))
    b = SecuredBroker(tmp_path_factory.mktemp("secured"), tls).start()
    yield b
    b.stop()


def run_kgo_tests(kgo_dir: Path, env: dict[str, str], names: tuple[str, ...]) -> dict[str, dict]:
    """`go test -json -run '^(names)$'` in kgo's directory: per test, its final action (pass/fail/skip), elapsed
    seconds and output."""
    pattern = "^(" + "|".join(names) + ")$"
    argv = [shutil.which("go") or "go", "test", "-json", "-count=1", f"-timeout={GO_TEST_TIMEOUT_S - 30}s",
            "-run", pattern, "."]
    try:
        proc = subprocess.run(argv, cwd=kgo_dir, capture_output=True, text=True, timeout=GO_TEST_TIMEOUT_S,
                              env=go_env(**env))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"go test {pattern} did not finish in {GO_TEST_TIMEOUT_S} s:\n{exc.stdout!r}"[-4000:],
                    pytrace=False)
    results: dict[str, dict] = {}
    package_output: list[str] = []
    for line in proc.stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            package_output.append(line)
            continue
        test = event.get("Test")
        if test is None:
            if event.get("Action") == "output":
                package_output.append(event.get("Output", "").rstrip("\n"))
            continue
        entry = results.setdefault(test, {"action": None, "elapsed": None, "output": []})
        if event.get("Action") == "output":
            entry["output"].append(event.get("Output", "").rstrip("\n"))
        elif event.get("Action") in ("pass", "fail", "skip"):
            entry["action"], entry["elapsed"] = event["Action"], event.get("Elapsed")
    if not results:
        build = proc.stderr + "\n".join(package_output)
        if "requires go >=" in build or "go.mod requires go" in build:
            pytest.skip(f"franz-go's kgo tests: the Go here is too old for {FRANZ_GO}@{FRANZ_GO_VERSION}: "
                        f"{build.strip()[-300:]}")
        pytest.fail(f"go test {pattern} ran no test (exit {proc.returncode}):\n{build[-4000:]}", pytrace=False)
    return results


@pytest.mark.parametrize(("mechanism", "scram"), [("SCRAM-SHA-256", "alice:alice-secret"),
                                                  ("SCRAM-SHA-512", "alice:alice-secret:512")])
def test_kgo_sasl_tests_pass_against_a_sasl_listener(kgo_dir, broker, mechanism, scram):
    mark = broker.process.log_path.stat().st_size
    env = {
        "KGO_SEEDS": broker.bootstrap,                                   # the suite's default clients: PLAINTEXT
        "KGO_TEST_SCRAM_SEEDS": broker.bootstrap_for("SASL_PLAINTEXT"),  # what the SCRAM tests dial
        "KGO_TEST_SCRAM": scram,                                         # alice's SCRAM-SHA-256/512 credential
    }
    results = run_kgo_tests(kgo_dir, env, SASL_TESTS)
    report = {name: (r["action"], r["elapsed"]) for name, r in results.items()}
    print(f"\n[franz-go {FRANZ_GO_VERSION} kgo, {mechanism} on SASL_PLAINTEXT] {report}")

    def explain(name: str) -> str:
        out = "\n".join(results.get(name, {}).get("output", []))
        return f"{name}: {report.get(name)}\n{out[-3000:]}\n--- broker log tail ---\n{broker.process.log_tail(30)}"

    for name in SASL_TESTS:
        assert name in results, f"{name} did not run: {report}"
        assert results[name]["action"] == "pass", explain(name)  # a skip fails too: they must run
    # the refused login is the broker's SASL_AUTHENTICATION_FAILED, not a dropped connection
    bad = "\n".join(results["TestSCRAMAuthBadCredentials"]["output"])
    assert "got expected error with bad credentials" in bad and "SASL_AUTHENTICATION_FAILED" in bad, bad

    text = broker.process.log_path.read_bytes()[mark:].decode(errors="replace")
    errors = [ln for ln in text.splitlines() if " ERROR " in ln or " CRITICAL " in ln or "Traceback" in ln]
    assert not errors, "broker logged errors:\n" + "\n".join(errors[:20])
