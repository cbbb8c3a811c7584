"""The CLI's error contract holds when the client library logs: a failure is one line on stderr, not the
library's log record of it followed by the command's error (found with a wrong SASL password against Kafka,
tests/kafka/test_client_on_kafka.py)."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = r"""
import argparse, logging, sys
from oncelog import cli_commands
from oncelog.client.errors import AuthenticationError

def handler(args):
    logging.getLogger("oncelog.client.cluster").error("authentication with %s failed", "127.0.0.1:1")
    logging.getLogger("oncelog.client.producer").warning("a warning of the library")
    raise AuthenticationError("SASL PLAIN authentication failed")

sys.exit(cli_commands.run(argparse.Namespace(handler=handler)))
"""


def test_a_failure_the_library_logged_is_still_one_line():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "oncelog: error: SASL_AUTHENTICATION_FAILED (58): SASL PLAIN authentication failed"]


def test_a_program_that_configured_logging_keeps_the_records():
    script = _SCRIPT.replace("import argparse, logging, sys\n",
                             "import argparse, logging, sys\nlogging.basicConfig(format='log: %(message)s')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "log: authentication with 127.0.0.1:1 failed", "log: a warning of the library",
        "oncelog: error: SASL_AUTHENTICATION_FAILED (58): SASL PLAIN authentication failed"]
