"""JSON schemas (kafka-python's format) of the inter-broker messages kafka-python does not ship."""
