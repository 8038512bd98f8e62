"""Core schema catalog: the canonical tables and their migrations."""
