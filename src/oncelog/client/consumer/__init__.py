"""The consumer: fetcher, group membership, offsets, and the Consumer / AsyncConsumer facades."""
