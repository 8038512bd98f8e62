"""README.md and every documentation page point only at what exists (``docs/hooks/page_checks.py``).

A reader follows what the documentation names, so each reference must lead somewhere: files,
modules and contract names, the flags of our commands and the versions of our packages. The
site's build runs the same checks; this test also covers README.md, which the site does not
build, and plants a page to show each kind of bad reference is caught.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from docs.hooks.page_checks import broken_references
from tests.architecture.packages import REPO_ROOT


def documents(root: Path = REPO_ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@pytest.mark.parametrize("document", documents(), ids=lambda d: d.relative_to(REPO_ROOT).as_posix())
def test_every_path_and_module_the_document_names_exists(document: Path) -> None:
    broken = broken_references(document)
    assert not broken, "\n".join(["documentation names what does not exist:", *broken])


PLANTED = """\
# A planted page

Good: [the runbook](runbook.md), `docs/runbook-cutover.md`, `tests/architecture/`,
tests/support/invariants.py::test_x, `nexuscrm_tools/exits.py`, `nexuscrm_sdk.testing`,
`nexuscrm_schema.invariants.check_invariants`, `examples.contact_stages:contact_stages`,
`nexuscrm.connectors.v1.ConnectorsService/Ingest`, `nexuscrm.buildinfo.v1.BuildInfo` and README.md.
Not references: `NEXUSCRM_DSN`, a.b, e.g. this, `Outcome.ADMITTED`, `myflows.boom:boom`,
`var/run/nexuscrm.db`, nexuscrm.db, `nexuscrm.flows`, `nexuscrm.connectors.v1.ConnectorsService/materializer`,
`tests/<owner>/unit`, `services/...`, `tests/system/{a,b}/`,
[a site](https://nexuscrm.example/docs/), [an anchor](#top), `contract/nexuscrm/**/*.proto`.

Bad: `docs/no-such-page.md`, [gone](no-such-file.md), tests/moved/away.py, `DESIGN.md`,
`nexuscrm_tools.invariants`, `nexuscrm_sdk.testing.NoSuchHelper`, `examples.contact_stages:missing`,
`nexuscrm.connectors.v1.ConnectorsService/NoSuchRpc`, `nexuscrm_tools/no_such_module.py`.
Flags: `nexuscrm queue state PACK --json`, `--lanes`, `pytest -k x`, `nexuscrm queue state PACK --no-such-flag`,
`--no-such-option`, `make run ARGS="--serve --forever"`. Versions: `nexuscrm-connectors` 0.2.0, contract 9.9.9,
schema v99, schema v3.
"""


def test_a_planted_page_is_refused_for_exactly_its_bad_references(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PLANTED)
    (tmp_path / "runbook.md").write_text("the link's target\n")

    assert broken_references(page) == [
        "page.md:12: docs/no-such-page.md: no such file or directory",
        "page.md:12: no-such-file.md: no such file",
        "page.md:12: tests/moved/away.py: no such file or directory",
        "page.md:12: DESIGN.md: no such file or directory",
        "page.md:13: nexuscrm_tools.invariants: nexuscrm_tools has no invariants",
        "page.md:13: nexuscrm_sdk.testing.NoSuchHelper: nexuscrm_sdk.testing has no NoSuchHelper",
        "page.md:13: examples.contact_stages:missing: examples.contact_stages has no missing",
        "page.md:14: nexuscrm.connectors.v1.ConnectorsService/NoSuchRpc: no such name in the contract",
        "page.md:14: nexuscrm_tools/no_such_module.py: no such file or directory",
        "page.md:15: --no-such-flag: no such flag of nexuscrm",
        "page.md:16: --no-such-option: no operator command has this flag",
        "page.md:16: --forever: no such flag of nexuscrm-run",
        "page.md:16: 9.9.9: contract: no such version in the tree",
        "page.md:17: schema v99: the newest schema version is 15",
    ]
