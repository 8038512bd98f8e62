"""The queue's hot path: admission, its duplicates and rows, replay, claims, payload reads and the background passes."""
