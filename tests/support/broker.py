"""Tests start brokers through the same embedding API users get."""

from oncelog.embedded import BrokerProcess

__all__ = ["BrokerProcess"]
