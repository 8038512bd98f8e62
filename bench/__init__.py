"""Benchmarks of the native Connectors runtime, separate from the tests (``make bench``).

Every figure of one run is measured side by side against the same database and quoted as a
ratio; ``python -m bench --help`` lists the sections. docs/performance.md says where each
measure stands; docs/performance-log.md keeps every pass.
"""
