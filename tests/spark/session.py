"""Spark sessions for the tests: one per test module, each in a JVM of its own.

A module may need JVM start-up settings of its own (`spark.jars` for Spark's Kafka connector), and those only
take effect when the JVM starts. PySpark keeps one JVM per Python process for its whole life, so `stop_session`
shuts that JVM down too: the next module starts from nothing and no module depends on the order they run in.
Logs are cut to errors (a log4j2 file handed to the JVM, so even start-up chatter is quiet), the UI is off and
every directory Spark writes to is under the test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
"""


def require_spark() -> None:
    """Skip (with the reason) where Spark cannot run: no JDK on PATH, or the `spark` extra not installed."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need a JDK 17+ (`java` on PATH); none found")
    pytest.importorskip("pyspark", reason="Spark tests need the `spark` extra: pip install -e '.[dev,spark]'")


def start_session(tmp: Path, conf: dict[str, str] | None = None, master: str = "local[2]") -> Any:
    """A fresh SparkSession in a fresh JVM whose files all live under `tmp`."""
    require_spark()
    from pyspark.sql import SparkSession

    # Python workers must be this interpreter (the venv): the system python3 has no pyarrow and no oncelog.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    tmp.mkdir(parents=True, exist_ok=True)
    log_conf = tmp / "log4j2.properties"
    log_conf.write_text(LOG4J2)
    java_tmp = tmp / "java-tmp"
    java_tmp.mkdir(exist_ok=True)
    java_opts = f"-Dlog4j2.configurationFile=file:{log_conf} -Djava.io.tmpdir={java_tmp} -XX:+UseSerialGC"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.local.dir": str(tmp / "local"),
        "spark.sql.warehouse.dir": str(tmp / "warehouse"),
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.streaming.stopTimeout": "30s",
    }
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName("oncelog-tests")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_session(spark: Any) -> None:
    """Stop the session and the JVM behind it, so the next session starts with its own JVM settings."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        # The JVM exits when the pipe to its stdin closes (how PySpark ties its life to the Python driver).
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()
            proc.wait(timeout=10)
    SparkContext._gateway = None
    SparkContext._jvm = None
