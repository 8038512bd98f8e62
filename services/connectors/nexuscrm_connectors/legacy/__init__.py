"""The old-protocol (v0) runtime, kept apart until every pack is cut over."""
