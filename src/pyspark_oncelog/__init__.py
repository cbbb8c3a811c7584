"""Automatic discovery of format "oncelog" by PySpark.

PySpark registers the `DefaultSource` of every top-level `pyspark_*` module on the Python path when a session
first touches a Python data source, so with oncelog installed `spark.read.format("oncelog")` works without a
`spark.dataSource.register(...)` call. The source itself lives in `oncelog.spark`.
"""

from oncelog.spark.source import OncelogDataSource as DefaultSource

__all__ = ["DefaultSource"]
