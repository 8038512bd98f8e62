"""Operator and developer tools of NexusCRM; never deployed with a service."""
