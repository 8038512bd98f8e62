"""The schema range's arithmetic and the gate's messages (``nexuscrm_runtime.release``, decision 144)."""

from __future__ import annotations

import pytest

from nexuscrm_runtime.prerequisites import StartRefused
from nexuscrm_runtime.release import Fit, Release, SchemaRefused, SchemaSupport, check_schema, fit
from nexuscrm_schema.verification import NEWEST_VERSION
from nexuscrm_schema_catalog.release import RELEASE as CATALOG

SUPPORT = SchemaSupport(minimum=8, newest=10, forward_window=2)
RELEASE = Release(owner="connectors", distribution="nexuscrm-connectors", schema=SUPPORT)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (0, Fit.MISSING),
        (7, Fit.TOO_OLD),
        (8, Fit.SUPPORTED),
        (10, Fit.SUPPORTED),
        (11, Fit.AHEAD),
        (12, Fit.AHEAD),
        (13, Fit.TOO_NEW),
    ],
)
def test_fit_places_a_version_against_the_range_and_its_window(version: int, expected: Fit) -> None:
    assert fit(SUPPORT, version) is expected
    assert expected.serves == (expected in (Fit.SUPPORTED, Fit.AHEAD))


def test_a_minimum_of_zero_serves_an_empty_database_and_no_window_refuses_the_next_version() -> None:
    catalog = SchemaSupport(minimum=0, newest=10, forward_window=0)
    assert fit(catalog, 0) is Fit.SUPPORTED
    assert fit(catalog, 11) is Fit.TOO_NEW


def test_the_catalog_serves_exactly_up_to_its_last_migration() -> None:
    assert (CATALOG.schema.minimum, CATALOG.schema.newest, CATALOG.schema.forward_window) == (0, NEWEST_VERSION, 0)


@pytest.mark.parametrize(("minimum", "newest", "window"), [(-1, 10, 0), (11, 10, 0), (0, 0, 0), (1, 10, -1)], ids=str)
def test_an_impossible_range_is_refused_at_construction(minimum: int, newest: int, window: int) -> None:
    with pytest.raises(ValueError, match="a schema range needs"):
        SchemaSupport(minimum=minimum, newest=newest, forward_window=window)


@pytest.mark.parametrize(
    ("version", "says"),
    [
        (0, "the database has no canonical schema (version 0)"),
        (7, "the database is at schema 7"),
    ],
)
def test_a_missing_or_old_schema_is_refused_naming_both_versions_the_release_and_the_migration(
    version: int, says: str
) -> None:
    with pytest.raises(SchemaRefused) as refused:
        check_schema(RELEASE, version)
    message = str(refused.value)
    assert isinstance(refused.value, StartRefused)  # run_service turns it into one line and exit 3
    assert says in message
    assert f"nexuscrm-connectors {RELEASE.version} serves schema 8..10 +2" in message
    assert 'nexuscrm-schema migrate --dsn "$NEXUSCRM_DSN"' in message
    assert "\n" not in message


def test_a_schema_past_the_window_is_refused_saying_migrations_never_go_back() -> None:
    with pytest.raises(SchemaRefused) as refused:
        check_schema(RELEASE, 13)
    message = str(refused.value)
    assert f"the database is at schema 13, past what nexuscrm-connectors {RELEASE.version} serves (8..10 +2)" in message
    assert "run a release that serves schema 13" in message
    assert "nexuscrm-schema status" in message


def test_inside_the_window_is_one_warning_and_inside_the_range_none() -> None:
    warning = check_schema(RELEASE, 12)
    assert warning is not None
    assert f"the database is at schema 12, newer than nexuscrm-connectors {RELEASE.version} knows (10)" in warning
    assert check_schema(RELEASE, 9) is None


def test_the_start_line_names_the_release_contract_range_and_database() -> None:
    assert RELEASE.start_line(9) == (
        f"nexuscrm-connectors {RELEASE.version} (contract {RELEASE.contract_version}, schema 8..10 +2, database at 9)"
    )
