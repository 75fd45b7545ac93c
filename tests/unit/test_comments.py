"""Code explains itself: no comment, docstring or string of the code cites a tracker issue or
a review by number.

A reader of the code cannot follow an issue's number or a review round's: each place says
what it guards against and why, and the history stays in git and in docs/development/.
The user pages' own check (no issue, test or benchmark path) is tests/unit/test_docs.py's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# "issue", "issues" or "review" and a number (with or without a space or a "#"): a tracker's
# issue or a review round. Examples in tests are split between the word and the number, so
# that this file and the docs check's table cite nothing themselves.
CITATION = re.compile(r"\bissues?\s+#?\d+|\breview\s?#?\d+", re.I)


def code_files() -> list[Path]:
    """The tracked Python and shell files outside docs/development/ (which keeps the history)."""
    names = subprocess.run(["git", "ls-files", "-z", "--", "*.py", "*.sh"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    return [ROOT / name for name in names
            if name and not name.startswith("docs/development/") and (ROOT / name).is_file()]


def citations(text: str) -> list[str]:
    return [f"{number}: {m[0]}" for number, line in enumerate(text.splitlines(), 1)
            for m in CITATION.finditer(line)]


def test_no_code_file_cites_an_issue_or_a_review() -> None:
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in code_files()
             for hit in citations(path.read_text(errors="replace"))]
    assert found == [], "say what the code guards against and why, not which issue or review asked for it"


@pytest.mark.parametrize(("line", "found"), [
    ("# Arithmetic, not copies (issue" " 15.7).", ["issue" " 15"]),
    ('"""One-write admission (Issue' ' 16 (c)).', ["Issue" " 16"]),
    ("the smoke tests of issue" " #3", ["issue" " #3"]),
    ("the target (issues" " 7 and 16)", ["issues" " 7"]),
    ('"""review' "11: the memo's key", ["review" "11"]),
    ("kept (review" " 8).", ["review" " 8"]),
    ("answers 503 to every review, so the webhooks' failurePolicy decides", []),
    ("an allowed review for 5 min, a denied one for 30 s", []),
    ("builder.issuer_name(issuer)", []),
    ("round 2 of the search", []),
])
def test_a_citation_is_found(line: str, found: list[str]) -> None:
    assert [hit.split(": ", 1)[1] for hit in citations(line)] == found
