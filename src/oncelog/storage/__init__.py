"""Partition logs on local disk, in Kafka's on-disk layout (segments, offset and time indexes, checkpoints).

Kafka's file formats are kept so that an operator's tools and habits (`kafka-dump-log`, reading a checkpoint
by eye, deleting a broken index to get it rebuilt) keep working on an oncelog data directory.
"""
