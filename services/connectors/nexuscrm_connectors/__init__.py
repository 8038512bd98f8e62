"""Connectors: receipts, Events and WorkItems of source projection."""
