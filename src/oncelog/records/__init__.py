"""RecordBatch v2: the bytes producers send, the broker stores and consumers read.

The broker keeps batches as opaque bytes wherever it can (`batch`), looks inside only when the
semantics demand it (`validate`), and builds its own batches with the same code clients use
(`builder`, `control`). `reader` is the client-side decoder; `compression` holds Kafka's codecs
with the framing quirks real clients depend on.
"""
