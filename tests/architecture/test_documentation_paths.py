"""README.md and docs/**/*.md point only at what exists: every relative file path and first-party module.

A reader follows what the documentation names, so each reference must lead somewhere:

- a markdown link or image (``[text](target)``): the target, relative to the document's
  directory (web addresses and anchors within a page are not followed);
- a relative path, in code or prose: a token with a ``/`` whose first part is a directory of
  the repository (``docs/x.md``, ``tests/a/b.py``) or a first-party package
  (``nexuscrm_tools/exits.py``, inside that package), from the repository root; and a
  document named alone (``DESIGN.md``), beside the document or at the root;
- a dotted module reference whose first part is a first-party package or a directory of
  importable code (``nexuscrm_sdk.testing``, ``nexuscrm_schema.invariants.check_invariants``,
  an entry point ``examples.contact_stages:contact_stages``): the module imports and the
  rest are its attributes. A name under ``nexuscrm`` that is no Python attribute may be a
  name of the contract (``nexuscrm.connectors.v1.ConnectorsService``, ``.../Ingest``) or an
  entry-point group of an installed distribution (``nexuscrm.flows``).

Anything else is not a reference: placeholders (``tests/<owner>``, ``services/...``,
``{unit,integration}``, ``*``), variables (``NEXUSCRM_DSN``), names whose first part is not
first-party (``Outcome.ADMITTED``, ``myflows.boom:boom``), file names (``nexuscrm.db``), paths
outside the repository's directories (``var/run/nexuscrm.db``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
from functools import cache
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool

import nexuscrm
from tests.architecture.packages import REPO_ROOT, load_packages

# The repository's top-level directories a path may start from.
DIRECTORIES = ("docs", "tests", "services", "libs", "tools", "examples", "protos", "requirements", "bench", ".ci")
# Directories of importable code that ship in no package.
CODE_DIRECTORIES = ("tests", "examples", "bench")

LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]*)+")
DOCUMENT_NAME = re.compile(r"[\w-]+\.md")
MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)?")
# A gRPC method, package.Service/Method (methods are PascalCase; ``.../materializer`` names a health status).
CONTRACT_METHOD = re.compile(r"(nexuscrm(?:\.\w+)+)/([A-Z]\w*)")
TOKEN_EDGES = "`\"'()[],;!?*"
# Last parts that make a dotted name a file name, not a module reference.
FILE_SUFFIXES = frozenset({"db", "md", "py", "sh", "toml", "txt", "json", "log", "yaml", "yml", "proto", "png"})


def documents(root: Path = REPO_ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@cache
def first_party_modules() -> frozenset[str]:
    modules = {module for package in load_packages().values() for module in package.modules}
    return frozenset(modules | set(CODE_DIRECTORIES))


@dataclasses.dataclass(frozen=True)
class Reference:
    line: int
    text: str
    kind: str  # "link", "path" or "module"


def references(text: str) -> list[Reference]:
    """Every link, relative path and first-party module reference of a markdown text, in reading order."""
    found: list[tuple[int, Reference]] = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if not re.match(r"[a-z][a-z+.-]*:|#", target):  # a web address or an anchor of this page
            found.append((match.start(), Reference(line_of(text, match.start()), target.split("#", 1)[0], "link")))
    text = LINK.sub(lambda m: " " * len(m.group(0)), text)  # the links are read: blank them, keeping offsets
    for match in re.finditer(r"\S+", text):
        for candidate in match.group(0).split("="):  # --flow=x.y:z
            # Punctuation around it is prose; a test id (file::test) names its file.
            token = candidate.lstrip(TOKEN_EDGES).rstrip(TOKEN_EDGES + ".:").split("::", 1)[0]
            if kind := classify(token):
                found.append((match.start(), Reference(line_of(text, match.start()), token, kind)))
    return [reference for _, reference in sorted(found, key=lambda pair: pair[0])]


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def classify(token: str) -> str | None:
    """The kind of reference ``token`` is, "path" or "module", or None when it is none this test follows."""
    if ".." in token or not token:
        return None
    if CONTRACT_METHOD.fullmatch(token):
        return "module"
    if PATH.fullmatch(token):
        first = token.split("/", 1)[0]
        return "path" if first in DIRECTORIES or first in first_party_modules() else None
    if DOCUMENT_NAME.fullmatch(token):
        return "path"
    if MODULE.fullmatch(token) and ("." in token or ":" in token) and token.rsplit(".", 1)[-1] not in FILE_SUFFIXES:
        return "module" if re.split(r"[.:]", token, maxsplit=1)[0] in first_party_modules() else None
    return None


def problem(reference: Reference, document: Path) -> str | None:
    """Why ``reference`` leads nowhere, or None when it exists."""
    if reference.kind == "link":
        return None if (document.parent / reference.text).exists() else "no such file"
    if reference.kind == "path":
        return None if path_exists(reference.text, document) else "no such file or directory"
    return module_problem(reference.text)


def path_exists(path: str, document: Path) -> bool:
    path = re.sub(r":\d+$", "", path)  # file:line
    first, _, rest = path.partition("/")
    if not rest and DOCUMENT_NAME.fullmatch(path):
        return (document.parent / path).exists() or (REPO_ROOT / path).exists()
    if first in DIRECTORIES:
        return (REPO_ROOT / path).exists()
    spec = importlib.util.find_spec(first)
    return spec is not None and any(Path(p, rest).exists() for p in spec.submodule_search_locations or ())


def module_problem(reference: str) -> str | None:
    method = CONTRACT_METHOD.fullmatch(reference)
    if method:
        return None if contract_symbol(".".join(method.groups())) else "no such name in the contract"
    module_name, colon, attributes = reference.partition(":")
    names = module_name.split(".")
    if colon:  # an entry point: the whole module, then its attributes
        prefix, rest = module_name, attributes.split(".")
    else:
        end = next((end for end in range(len(names), 0, -1) if is_module(".".join(names[:end]))), 0)
        if end == 0:
            return f"no module {names[0]}"
        prefix, rest = ".".join(names[:end]), names[end:]
    try:
        value: object = importlib.import_module(prefix)
    except ImportError as error:
        return f"{prefix} does not import: {error}"
    for attribute in rest:
        if not hasattr(value, attribute):
            if names[0] == "nexuscrm" and (contract_symbol(module_name) or module_name in entry_point_groups()):
                return None
            return f"{prefix} has no {attribute}"
        value = getattr(value, attribute)
    return None


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent is missing or is no package
        return False


def entry_point_groups() -> frozenset[str]:
    return frozenset(importlib.metadata.entry_points().groups)


@cache
def contract() -> descriptor_pool.DescriptorPool:
    """The descriptor pool holding every message, enum and service of the generated contract."""
    for module in pkgutil.walk_packages(nexuscrm.__path__, "nexuscrm."):
        if module.name.endswith("_pb2"):
            importlib.import_module(module.name)
    return descriptor_pool.Default()


def contract_symbol(name: str) -> bool:
    """Whether ``name`` is a package, message, enum, service or method of the contract."""
    pool = contract()
    try:
        pool.FindFileContainingSymbol(name)
    except KeyError:
        try:
            pool.FindMethodByName(name)
        except KeyError:
            return False
    return True


def broken_references(document: Path) -> list[str]:
    found = []
    for reference in references(document.read_text()):
        if (why := problem(reference, document)) is not None:
            where = document.relative_to(REPO_ROOT) if document.is_relative_to(REPO_ROOT) else document.name
            found.append(f"{where}:{reference.line}: {reference.text}: {why}")
    return found


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
    ]
