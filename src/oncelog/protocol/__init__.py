"""The Kafka wire protocol as oncelog speaks it.

Two kinds of codec live here, on purpose. The hot path (request header, Produce
request, Produce response, Fetch request, Fetch response) is hand-written over
`memoryview` and `struct`: it is an order of magnitude cheaper per request than the
schema-driven libraries, it hands produce batches to the log without copying them,
and it can emit a fetch response as header bytes interleaved with file regions for
`sendfile`. Every other API goes through kafka-python's schema codecs behind
`messages.py`, where per-request cost does not matter and schema coverage does.
"""
