"""PySpark data sources for oncelog: `format("oncelog")` reads topics in batch and streaming queries.

    import oncelog.spark                  # before the SparkSession is built: workers use this interpreter
    spark = SparkSession.builder.getOrCreate()
    df = spark.read.format("oncelog").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("subscribe", "events").load()
    df.write.format("oncelog").mode("append").option("kafka.bootstrap.servers", "127.0.0.1:9092") \
        .option("topic", "events").save()     # .mode("append") is required (sink.py says why)

Spark's Python workers must run an interpreter that has oncelog and pyarrow installed, and PySpark picks the
workers' interpreter from `PYSPARK_PYTHON` when the SparkContext starts (the system `python3` otherwise).
Importing this package sets `PYSPARK_PYTHON` to the current interpreter unless it is already set, so a driver
started from the project's venv gets workers from the same venv. PySpark finds the format by itself
(`pyspark_oncelog.DefaultSource`); `register(spark)` registers it explicitly, for Python paths where that
discovery does not run.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from oncelog.spark.source import OncelogDataSource

__all__ = ["OncelogDataSource", "register", "use_this_python"]


def use_this_python() -> None:
    """Make Spark start its Python workers with this interpreter, unless the user chose one already."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def register(spark: Any) -> None:
    """Register format "oncelog" in `spark` (a SparkSession)."""
    spark.dataSource.register(OncelogDataSource)


use_this_python()
