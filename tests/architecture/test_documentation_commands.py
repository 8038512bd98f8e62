"""Every command a documentation page shows in a shell block runs, as the page writes it.

A fenced block of language ``sh`` or ``bash`` on a page under docs/ is run by bash
(``set -euo pipefail``) from the repository root, with the checkout's ``.venv/bin`` first on
``PATH`` and the targets of one served demo system exported (``nexuscrm-run --serve``, as the
tutorial starts it), so ``nexuscrm ... demo/demo-contacts`` reaches a real pack. A block is not
run when its title says why: ``title="illustrative: WHY"`` (it needs what a test machine has not:
a production database, a long suite, a server that runs until Ctrl-C) or ``title="run by PATH"``
(another test runs it, for example in a clean virtualenv). Decision 186.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.architecture.packages import REPO_ROOT
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

PAGES = sorted((REPO_ROOT / "docs").rglob("*.md"))
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
SHELLS = ("sh", "bash")
NOT_RUN = re.compile(r'title="(illustrative: .+|run by \S+.*)"')
BLOCK_TIMEOUT = 180.0  # seconds for one block (a make run of a few hundred inputs on a busy machine)
SERVE_TIMEOUT = 120.0  # seconds for the served demo system to print its targets


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int
    info: str
    commands: str

    @property
    def runs(self) -> bool:
        return NOT_RUN.search(self.info) is None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT / 'docs').as_posix()}:{self.line}"


def shell_blocks(page: Path) -> list[Block]:
    """Each shell block of a page, its commands dedented, in page order."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        info = match.group("info").strip()
        if info.split(" ", 1)[0] not in SHELLS:
            continue
        indent = len(match.group("indent"))
        body = "\n".join(line[indent:] for line in match.group("body").splitlines())
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, info, body))
    return found


BLOCKS = [block for page in PAGES for block in shell_blocks(page)]
RUN = [block for block in BLOCKS if block.runs]


def test_each_block_that_is_not_run_says_why() -> None:
    for block in BLOCKS:
        assert block.info in SHELLS or NOT_RUN.search(block.info), f"{block.id}: a title other than illustrative/run by"
    assert len(RUN) >= 8, [block.id for block in RUN]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The targets of a served demo system (``nexuscrm-run --serve``), as its export lines say."""
    runner = REPO_ROOT / ".venv" / "bin" / "nexuscrm-run"
    assert runner.exists(), "the checkout's .venv has no nexuscrm-run (make runtime builds it)"
    workdir = tmp_path_factory.mktemp("served")
    log = tmp_path_factory.mktemp("served-log") / "run.log"  # the runner empties its workdir first
    env = {k: v for k, v in os.environ.items() if k != "NEXUSCRM_DSN"}
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(runner), "--serve", "--lanes", "10", "--inputs", "100", "--rate", "0", "--workdir", str(workdir)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def targets() -> dict[str, str]:
        assert process.poll() is None, f"nexuscrm-run ended with {process.returncode}:\n{log.read_text()}"
        return dict(re.findall(r"^\s*export (NEXUSCRM_\w+_TARGET)=(\S+)$", log.read_text(), re.MULTILINE))

    try:
        yield wait_until(targets, f"the served system's targets in {log}", SERVE_TIMEOUT, poll=0.1)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize("block", RUN, ids=lambda block: block.id)
def test_the_block_runs(block: Block, served: dict[str, str]) -> None:
    if "make " in block.commands:
        runtime = subprocess.run(["make", "-q", "runtime"], cwd=REPO_ROOT, check=False)
        assert runtime.returncode == 0, "the runtime environment is not up to date: make run would install it first"
    env = {k: v for k, v in os.environ.items() if k != "NEXUSCRM_DSN"}
    env |= served | {"PATH": f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.commands],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}:\n{block.commands}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


if __name__ == "__main__":  # the counts the documentation reports
    commands = sum(
        1 for block in RUN for line in block.commands.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )
    print(f"{len(BLOCKS)} shell blocks, {len(RUN)} run, {commands} command lines run", file=sys.stdout)
