"""Operator features: pauses, order and retry policies, dead letters, coverage, retention and the operator's reads."""
