"""The SDK worker sends a failed Flow's traceback with Fail, its end within the bound, never logged (decision 175)."""

from __future__ import annotations

import logging

import pytest

from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.testing import InMemoryWorkSource
from nexuscrm_sdk.worker import TRACEBACK_CUT, Worker, bounded_traceback
from tests.connectors.unit.test_sdk_testing import identity, run_all
from workqueue.limits import TRACEBACK_MAX_BYTES


def test_a_failed_flows_traceback_goes_with_fail_and_not_to_the_log(caplog: pytest.LogCaptureFixture) -> None:
    source = InMemoryWorkSource(max_attempts=1)
    source.add_inputs(identity(), payloads=[b"{}"])

    def flow(generation: Generation) -> None:
        list(generation.inputs)
        raise ValueError("\n".join(f"field {n} is wrong" for n in range(2000)))  # a traceback over the bound

    with caplog.at_level(logging.DEBUG):
        run_all(Worker(source, flow, worker_id="w"))
    (attempt,) = source.attempts
    assert attempt.traceback is not None
    assert attempt.traceback.startswith(TRACEBACK_CUT) and "field 1999 is wrong" in attempt.traceback
    assert len(attempt.traceback.encode()) <= TRACEBACK_MAX_BYTES
    assert "Traceback" not in caplog.text and "field 1999" not in caplog.text  # the log has the message's start only


def test_a_traceback_within_the_bound_is_sent_whole_and_a_longer_one_loses_its_start_whole_characters() -> None:
    short = "Traceback (most recent call last):\n  ValueError: x\n"
    assert bounded_traceback(short) == short
    long = "é" * TRACEBACK_MAX_BYTES + "\nValueError: the end"  # two bytes a character: a cut may split one
    cut = bounded_traceback(long)
    assert cut.startswith(TRACEBACK_CUT) and cut.endswith("\nValueError: the end")
    assert TRACEBACK_MAX_BYTES - 1 <= len(cut.encode()) <= TRACEBACK_MAX_BYTES
    assert set(cut.removeprefix(TRACEBACK_CUT).removesuffix("\nValueError: the end")) == {"é"}
