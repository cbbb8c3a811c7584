"""SASL on the broker: the per-connection state machine and the mechanisms behind one interface."""
