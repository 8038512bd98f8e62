"""Plumbing shared by the four NexusCRM services; no domain logic lives here."""
