"""What a documentation page names must exist: files, modules, contract names, flags, versions.

Run by the site's build (``docs/hooks/mkdocs_hooks.py``: a page that names something missing
is a warning, and ``mkdocs build --strict`` fails on it) and by
``tests/architecture/test_documentation_paths.py`` on README.md and every page.

References followed:

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
  entry-point group of an installed distribution (``nexuscrm.flows``);
- a flag of an operator command: on a line of a code block or an inline code span that runs
  one of them (``nexuscrm queue state PACK --json``), each flag must be one of that command's
  parsers (``commands_reference``); an inline code span that is a flag alone (``--lanes``) must be
  a flag of some operator command;
- a version of ours: ``X.Y.Z`` after a first-party distribution's name or the word
  "contract" must be a version the tree declares (a package's own, or a previous release
  in owners.toml), and ``schema vN`` at most the newest schema version.

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
import tomllib
from functools import cache
from pathlib import Path

from google.protobuf import descriptor_pool

import nexuscrm
from docs.hooks.commands_reference import COMMANDS, walk
from nexuscrm_schema.verification import NEWEST_VERSION
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


@cache
def first_party_modules() -> frozenset[str]:
    """The import names the repository's distributions ship, and its directories of importable code."""
    modules = {module for package in load_packages().values() for module in package.modules}
    return frozenset(modules | set(CODE_DIRECTORIES))


@dataclasses.dataclass(frozen=True)
class Reference:
    """One reference of a page: its line, its text, and its kind ("link", "path" or "module")."""

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
    """The 1-based line of ``offset`` in ``text``."""
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
    """Whether a relative path a page names exists, from the root or inside the package it starts with."""
    path = re.sub(r":\d+$", "", path)  # file:line
    first, _, rest = path.partition("/")
    if not rest and DOCUMENT_NAME.fullmatch(path):
        return (document.parent / path).exists() or (REPO_ROOT / path).exists()
    if first in DIRECTORIES:
        return (REPO_ROOT / path).exists()
    spec = importlib.util.find_spec(first)
    return spec is not None and any(Path(p, rest).exists() for p in spec.submodule_search_locations or ())


def module_problem(reference: str) -> str | None:
    """Why a dotted module reference (or contract name) does not resolve, or None when it does."""
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
    """Whether ``name`` is an importable module."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent is missing or is no package
        return False


def entry_point_groups() -> frozenset[str]:
    """The entry-point groups of the installed distributions."""
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


def broken_references(document: Path, text: str | None = None) -> list[str]:
    """``file:line: reference: why`` for each reference of ``document`` (or of its ``text``) that leads nowhere."""
    text = document.read_text() if text is None else text
    found = [
        (reference.line, reference.text, why)
        for reference in references(text)
        if (why := problem(reference, document)) is not None
    ]
    history = is_history(document)
    found += flag_problems(text, history) + version_problems(text, history)
    where = document.relative_to(REPO_ROOT) if document.is_relative_to(REPO_ROOT) else document.name
    return [f"{where}:{line}: {name}: {why}" for line, name, why in sorted(found, key=lambda f: f[0])]


def is_history(document: Path) -> bool:
    """Whether ``document`` records the past (a decision, the performance log).

    A history page may name released versions and other tools' flags alone.
    """
    return document.parent.name == "decisions" or document.name == "performance-log.md"


# --- flags ------------------------------------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?==|\b(?!-))")
CODE_BLOCK = re.compile(r"^(`{3,})[^\n]*\n(.*?)^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# A command line: optional variable assignments and a .venv/bin/ prefix, then the command.
COMMAND_LINE = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?(?P<command>[a-z][\w-]*)\b(?P<rest>.*)$")
# make run passes ARGS to nexuscrm-run.
MAKE_RUN = re.compile(r"^(?:[A-Z_]+=\S+\s+)*make run ARGS=(?P<rest>.*)$")


@cache
def command_flags() -> dict[str, frozenset[str]]:
    """Each operator command's flags, its subcommands' included."""
    return {
        name: frozenset(
            option for parser in walk(build()) for action in parser._actions for option in action.option_strings
        )
        for name, build in COMMANDS.items()
    }


def _command_of(line: str) -> tuple[str, str] | None:
    """(command, the rest of the line) when ``line`` runs an operator command."""
    if make := MAKE_RUN.match(line.strip()):
        return "nexuscrm-run", make.group("rest")
    match = COMMAND_LINE.match(line.strip())
    if match and match.group("command") in COMMANDS:
        return match.group("command"), match.group("rest")
    return None


def flag_problems(text: str, history: bool = False) -> list[tuple[int, str, str]]:
    """(line, flag, why) for each flag no parser has, on a command line or (outside history) a flag-only span."""
    found = []
    every = frozenset().union(*command_flags().values())
    blocks = [(m.start(2), m.group(2)) for m in CODE_BLOCK.finditer(text)]
    spans = [
        (m.start(1), m.group(1)) for m in INLINE_CODE.finditer(CODE_BLOCK.sub(lambda m: " " * len(m.group(0)), text))
    ]
    for offset, code in blocks + spans:
        for number, line in enumerate(code.splitlines()):
            # One command of the line: up to a comment or the next command (||, &&, |, ;).
            command = _command_of(re.split(r"\s#|\|\||&&|[|;]", line, maxsplit=1)[0])
            if command is not None:
                name, rest = command
                known, why = command_flags()[name], f"no such flag of {name}"
            elif (
                not history
                and FLAG.fullmatch(line.strip().split("=", 1)[0].split(" ", 1)[0])
                and line.strip().startswith("--")
            ):
                rest, known, why = line.strip().split(" ", 1)[0], every, "no operator command has this flag"
            else:
                continue
            for flag in FLAG.findall(rest):
                if flag not in known and flag != "-":
                    found.append((line_of(text, offset) + number, flag, why))
    return found


# --- versions ---------------------------------------------------------------------------------

OUR_VERSION = re.compile(r"(?P<who>nexuscrm-[a-z-]+|\bcontract)\b[^.;\n]{0,40}?\b(?P<version>\d+\.\d+\.\d+)\b(?!\.\d)")
SCHEMA_NAMED = re.compile(r"\bschema v(\d+)\b")


@cache
def declared_versions() -> frozenset[str]:
    """The versions the tree declares: each package's own and each owner's previous release."""
    owners = tomllib.loads((REPO_ROOT / "owners.toml").read_text())["owners"]
    previous = {owner["previous"]["version"] for owner in owners.values() if "previous" in owner}
    return frozenset({package.version for package in load_packages().values()} | previous)


@cache
def released_contract_versions() -> frozenset[str]:
    """Every version of the wire contract ever released (protos/CHANGELOG.md's headings)."""
    return frozenset(
        re.findall(r"^## (\d+\.\d+\.\d+)$", (REPO_ROOT / "protos" / "CHANGELOG.md").read_text(), re.MULTILINE)
    )


def version_problems(text: str, history: bool = False) -> list[tuple[int, str, str]]:
    """(line, version, why) for each version of ours the tree does not declare, and each schema past the newest.

    A history page may also name any released contract version; every other page names the
    current ones (a version two releases old misleads as much as one that never was).
    """
    allowed = declared_versions() | (released_contract_versions() if history else frozenset())
    found = [
        (line_of(text, m.start("version")), m.group("version"), f"{m.group('who')}: no such version in the tree")
        for m in OUR_VERSION.finditer(text)
        if m.group("version") not in allowed
    ]
    found += [
        (line_of(text, m.start()), m.group(0), f"the newest schema version is {NEWEST_VERSION}")
        for m in SCHEMA_NAMED.finditer(text)
        if int(m.group(1)) > NEWEST_VERSION
    ]
    return found
