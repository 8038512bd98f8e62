"""The operator commands: flags, exit codes, JSON output, timeouts, and a DSN that is never printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_schema.tables import PackInstall
from nexuscrm_tools.exits import ExitCode
from tests.controlplane.integration.history import (
    FakeClock,
    arm,
    history,
    install,
    items,
    run_cli,
)
from tests.support.checksums import database_digest
from tests.support.invariants import assert_invariants
from tests.system.integration.old_workers import run_old_workers

CUTOVER = "connector-projection-cutover"
DRAIN = "connector-projection-drain"
FENCE = "connector-admission-fence"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_a_missing_dsn_is_a_clear_error() -> None:
    result = run_cli(CUTOVER, ["-pack-install-id", "pk-x", "-timeout", "30s"], None)
    assert result.returncode == ExitCode.UNREACHABLE
    assert "CONNECTOR_CUTOVER_DSN is not set" in result.stderr


def test_an_unreachable_database_is_a_clear_error_that_never_prints_the_dsn() -> None:
    dsn = "mysql://cutover:hunter2-secret@127.0.0.1:1/nexus"
    result = run_cli(CUTOVER, ["-pack-install-id", "pk-x", "-timeout", "30s"], dsn)
    assert result.returncode == ExitCode.UNREACHABLE
    assert "CONNECTOR_CUTOVER_DSN" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr and "cutover:" not in result.stderr.replace(CUTOVER, "")


@pytest.mark.parametrize(
    "args",
    [
        ["-timeout", "30s"],
        ["-pack-install-id", "pk-x", "-timeout", "5 minutes"],
        ["-pack-install-id", "pk-x", "-no-such-flag"],
        ["-pack", "pk-x"],  # no abbreviations
    ],
)
def test_usage_errors(args: list[str], tmp_path: Path) -> None:
    result = run_cli(CUTOVER, args, f"sqlite:///{tmp_path / 'unused.db'}")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "usage:" in result.stderr


@pytest.mark.database
def test_exit_codes_for_every_outcome_and_the_dsn_is_never_printed(
    engine: sa.Engine, dsn: str, clock: FakeClock
) -> None:
    legacy = LegacyRuntime(engine, clock)
    no_handoff = install(engine, clock, handoff=False)
    pack = install(engine, clock)
    legacy.ingest(pack, items(["k1", "k2"]))
    run_old_workers(legacy, pack)  # Event 2 is left beyond the completed boundary
    outputs: list[str] = []

    def run(args: list[str], command: str = CUTOVER) -> tuple[int, str, str]:
        result = run_cli(command, args, dsn)
        outputs.append(result.stdout + result.stderr)
        return result.returncode, result.stdout, result.stderr

    unarmed = database_digest(engine)
    assert run(["-pack-install-id", "pk-nope", "-timeout", "30s"])[0] == ExitCode.USAGE
    code, _, err = run(["-pack-install-id", pack, "-timeout", "30s"])
    assert code == ExitCode.REFUSED_GATE and "fence_missing" in err
    assert database_digest(engine) == unarmed  # refusals write nothing
    arm(engine, clock)
    armed = database_digest(engine)
    code, _, err = run(["-pack-install-id", no_handoff, "-timeout", "30s"])
    assert code == ExitCode.MISSING_PREREQUISITE and "work_item_handoff_missing" in err
    code, out, _ = run(["-pack-install-id", pack, "-timeout", "30s", "-json"])
    document = json.loads(out)
    assert code == ExitCode.REFUSED_AUDIT == document["exit_code"]
    assert document["outcome"] == "refused_audit"
    assert document["report"]["findings"][0]["rule"] == "beyond_completed_boundary"
    assert document["report"]["findings"][0]["sample_ids"] == ["event:2"]
    assert database_digest(engine) == armed

    legacy.ingest(pack, items(["k3"]))  # the fence holds admission: stored only
    with engine.begin() as connection:  # lift the fence for the old writer only, then restore it
        connection.execute(sa.text("DELETE FROM AdmissionFence"))
    legacy.ingest(pack, items(["k4"]))
    run_old_workers(legacy, pack)
    arm(engine, clock)
    before, everything = history(engine), database_digest(engine)
    code, out, _ = run(["-pack-install-id", pack, "-timeout", "30s", "-dry-run"])
    assert code == ExitCode.OK and "dry run passed" in out
    assert database_digest(engine) == everything  # the dry run wrote no checkpoint, nor anything else
    code, out, _ = run(["-pack-install-id", pack, "-timeout=1m"])
    assert code == ExitCode.OK and "checkpoint written" in out and "LegacyMaxOrdinal 3" in out
    code, out, _ = run(["--pack-install-id", pack, "--timeout", "1m"])
    assert code == ExitCode.OK and "checkpoint already written" in out and "LegacyMaxOrdinal 3" in out
    assert history(engine) == before
    for output in outputs:
        assert dsn not in output
    assert_invariants(engine)


@pytest.mark.database
def test_a_held_lock_ends_in_the_timeout_exit_code_with_nothing_written(
    engine: sa.Engine, dsn: str, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    arm(engine, clock)
    before = database_digest(engine)
    with engine.begin() as connection:  # an admission transaction that does not end
        connection.execute(sa.select(PackInstall).where(PackInstall.c.PackInstallId == pack).with_for_update())
        result = run_cli(CUTOVER, ["-pack-install-id", pack, "-timeout", "1s"], dsn)
    assert result.returncode == ExitCode.TIMEOUT, result.stderr
    assert "nothing was written" in result.stderr
    assert database_digest(engine) == before
    assert_invariants(engine)


@pytest.mark.database
def test_the_drain_wait_reports_what_holds_it_and_never_changes_a_status(
    engine: sa.Engine, dsn: str, clock: FakeClock
) -> None:
    legacy = LegacyRuntime(engine, clock)
    pack = install(engine, clock)
    work_id = legacy.ingest(pack, items(["k1"]))[0].work_id
    claim = legacy.claim("w", pack)
    legacy.fail(claim.work.work_id, claim.lease_token, "CRM timeout")
    before = database_digest(engine)

    waited = run_cli(DRAIN, ["-pack-install-id", pack, "-timeout", "300ms", "-interval", "100ms", "-json"], dsn)

    assert waited.returncode == ExitCode.TIMEOUT
    report = json.loads(waited.stdout)
    assert (report["drained"], report["retry"], report["sample_work_ids"]) == (False, 1, [work_id])
    assert report["holds"][0]["reason"] == "retry_wait" and report["holds"][0]["sample_work_ids"] == [work_id]
    assert database_digest(engine) == before

    clock.advance(3600)
    run_old_workers(legacy, pack)
    done = run_cli(DRAIN, ["-pack-install-id", pack, "-timeout", "30s"], dsn)
    assert done.returncode == ExitCode.OK and "drained" in done.stdout
    assert_invariants(engine)


@pytest.mark.database
def test_the_fence_command_arms_lists_overrides_and_disarms(engine: sa.Engine, dsn: str, clock: FakeClock) -> None:
    pack = install(engine, clock)
    armed = run_cli(FENCE, ["arm", "-namespace", "acme", "-reason", "cutover"], dsn)
    assert armed.returncode == ExitCode.OK, armed.stderr
    fence = json.loads(armed.stdout)
    assert (fence["scope"], fence["expires_at"], fence["reason"]) == ("*", None, "cutover")
    added = run_cli(FENCE, ["override-add", "-fence-id", fence["fence_id"], "-pack-install-id", pack], dsn)
    assert json.loads(added.stdout)["overrides"] == [{"pack_install_id": pack, "expires_at": None}]
    assert (
        run_cli(FENCE, ["override-remove", "-fence-id", fence["fence_id"], "-pack-install-id", pack], dsn).returncode
        == ExitCode.OK
    )
    listed = json.loads(run_cli(FENCE, ["list", "-namespace", "acme"], dsn).stdout)
    assert [f["fence_id"] for f in listed] == [fence["fence_id"]] and listed[0]["overrides"] == []
    assert run_cli(FENCE, ["disarm", "-fence-id", fence["fence_id"]], dsn).returncode == ExitCode.OK
    disarmed = database_digest(engine)
    assert run_cli(FENCE, ["disarm", "-fence-id", fence["fence_id"]], dsn).returncode == ExitCode.USAGE
    assert json.loads(run_cli(FENCE, ["list", "-namespace", "acme"], dsn).stdout) == []
    assert database_digest(engine) == disarmed  # the refused disarm and the list wrote nothing
    assert_invariants(engine)
