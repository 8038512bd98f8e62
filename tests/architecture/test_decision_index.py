"""The decision index (docs/decisions/README.md) lists every record once, with the record's own status.

Every record file has a row and every row a file, in number order; the sentence "Numbers without
a record (...)" names exactly the unused numbers below the highest record. A row's status is
what its record says in the paragraph under its title: ``Amended by NNN`` (every number named
there, in number order), ``Superseded by NNN``, ``Folded into the performance log``, or none of
these (accepted). A record that ``Amends NNN`` is named in NNN's paragraph, so the amended
record says so itself.
"""

from __future__ import annotations

import dataclasses
import re
from functools import cache
from pathlib import Path

from tests.architecture.packages import REPO_ROOT

DECISIONS = REPO_ROOT / "docs" / "decisions"
INDEX = DECISIONS / "README.md"
RECORD = re.compile(r"(\d{3})-[\w-]+\.md")
# A row: number, [title](file), summary, status (a title or summary may hold a ``|`` in code).
ROW = re.compile(r"\| (\d{3}) \| \[.+?\]\((\S+?)\) \| .+ \| ([^|]+) \|")
UNUSED = re.compile(r"^Numbers without a record \(([^)]*)\)", re.MULTILINE)
PARENTHESES = re.compile(r"\([^()]*\)")
NUMBER_LIST = r"(\d{3}(?:\s*(?:,|and)\s*\d{3})*)"
AMENDED_BY = re.compile(r"Amended by " + NUMBER_LIST)
AMENDS = re.compile(r"\bAmends (?:decisions? )?" + NUMBER_LIST)
SUPERSEDED_BY = re.compile(r"^Superseded by (\d{3})")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclasses.dataclass(frozen=True)
class Row:
    number: int
    target: str
    status: str


@cache
def records() -> dict[int, Path]:
    found: dict[int, Path] = {}
    for path in sorted(DECISIONS.glob("*.md")):
        if match := RECORD.fullmatch(path.name):
            assert int(match.group(1)) not in found, f"two records numbered {match.group(1)}"
            found[int(match.group(1))] = path
    return found


def rows(index: str) -> list[Row]:
    return [Row(int(m.group(1)), m.group(2), m.group(3).strip()) for m in ROW.finditer(index)]


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d{3}", text)]


def status_paragraph(record: str) -> str:
    """The first paragraph under a record's title, on one line (where its status is said)."""
    lines = record.splitlines()[1:]
    while lines and not lines[0].strip():
        lines.pop(0)
    paragraph = []
    for line in lines:
        if not line.strip() or line.startswith("#"):
            break
        paragraph.append(line.strip())
    return " ".join(paragraph)


def intro(record: str) -> str:
    """A record's text before its first section, parentheses left out, on one line."""
    text = record.split("\n## ", 1)[0].split("\n", 1)[1]
    return " ".join(PARENTHESES.sub("", " ".join(text.split())).split())


def amended_by(paragraph: str) -> list[int]:
    """The records a status paragraph says amend it, in number order (parentheses are prose)."""
    said = AMENDED_BY.findall(PARENTHESES.sub("", paragraph))
    return sorted(set(numbers(" ".join(said))))


def link(number: int) -> str:
    return f"[{number:03d}]({records()[number].name})"


def expected_status(record: str) -> str:
    """The index's status of a record (its text), from its own paragraph under its title."""
    paragraph = status_paragraph(record)
    if paragraph.startswith("Folded into the performance log"):
        return f"folded into [the performance log]({LINK.findall(paragraph)[0]})"
    if superseded := SUPERSEDED_BY.match(paragraph):
        return f"superseded by {link(int(superseded.group(1)))}"
    if paragraph.startswith("Amended by"):
        return "amended by " + ", ".join(link(n) for n in amended_by(paragraph))
    return "accepted"


def unused_numbers(sentence: str) -> list[int]:
    """The numbers a "Numbers without a record" list names: ``004-009, 105`` is 4 to 9 and 105."""
    named: list[int] = []
    for part in sentence.split(", "):
        first, _, last = part.partition("-")
        named.extend(range(int(first), int(last or first) + 1))
    return named


def test_every_record_has_one_row_and_every_row_a_record_in_number_order() -> None:
    listed = rows(INDEX.read_text())
    assert [row.number for row in listed] == sorted(records()), "rows in number order, one per record file"
    for row in listed:
        assert row.target == records()[row.number].name, row


def test_the_numbers_without_a_record_are_exactly_the_unused_ones_below_the_highest() -> None:
    found = UNUSED.search(INDEX.read_text())
    assert found is not None, 'the index ends with "Numbers without a record (...)"'
    unused = [n for n in range(1, max(records()) + 1) if n not in records()]
    assert unused_numbers(found.group(1)) == unused


def test_each_rows_status_is_the_records_own() -> None:
    wrong = {
        row.number: (row.status, expected)
        for row in rows(INDEX.read_text())
        if row.status != (expected := expected_status(records()[row.number].read_text()))
    }
    assert wrong == {}, "number: (the index's status, the record's)"


def test_a_record_that_amends_another_is_named_in_the_amended_records_status() -> None:
    said = {number: amended_by(status_paragraph(path.read_text())) for number, path in records().items()}
    unsaid = [
        (number, amended)
        for number, path in records().items()
        for match in AMENDS.finditer(intro(path.read_text()))
        for amended in numbers(match[1])
        if number not in said[amended]
    ]
    assert unsaid == [], "(amending record, amended record) whose amendment the amended record does not say"


def test_the_status_reading_follows_the_indexs_statuses() -> None:
    cases = {
        "Amended by 102 (the why, see 104) and 101: what changed. Amended by 103: more.": (
            f"amended by {link(101)}, {link(102)}, {link(103)}"
        ),
        "Superseded by 102.": f"superseded by {link(102)}",
        "Folded into the performance log. Its text: [the log](../performance.md#1-x).": (
            "folded into [the performance log](../performance.md#1-x)"
        ),
        "Issue 7. Amends 101 (the section).": "accepted",
    }
    for paragraph, status in cases.items():
        assert expected_status(f"# 999 A title\n\n{paragraph}\n\n## Context\n\nText.\n") == status, paragraph
    assert intro("# 999 A title\n\nIssue 7. Amends 101 (the section) and 102.\n\n## Context\n") == (
        "Issue 7. Amends 101 and 102."
    )
