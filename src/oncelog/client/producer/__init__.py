"""The producer: accumulator (batches), sender (requests and the seeds' rules), idempotence (sequences),
transactions (the coordinator side), producer (the `Producer` and `AsyncProducer` facades)."""

from .producer import AsyncProducer, DeliveryReport, Producer

__all__ = ["Producer", "AsyncProducer", "DeliveryReport"]
