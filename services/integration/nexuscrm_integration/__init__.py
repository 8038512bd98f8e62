"""Core Integration Service: activation gate and worker host."""
