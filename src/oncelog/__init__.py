"""oncelog: a Kafka-protocol broker with exactly-once producer state, a Python client and PySpark pipelines."""

__version__ = "0.1.0"
