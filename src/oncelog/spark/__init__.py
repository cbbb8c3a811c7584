"""PySpark data sources for oncelog: `format("oncelog")` reads topics in batch and streaming queries.

    from oncelog.spark import register
    register(spark)
    df = spark.read.format("oncelog").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("subscribe", "events").load()

Spark's Python workers must run an interpreter that has oncelog and pyarrow installed; `register` points
`PYSPARK_PYTHON` at the current interpreter unless it is already set (it only affects workers started after
the SparkContext reads it, so call it, or set the variable, before building the session when you can).
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
    use_this_python()
    spark.dataSource.register(OncelogDataSource)
