"""Canonical schema of NexusCRM: tables, lengths, version and verification as plain functions."""
