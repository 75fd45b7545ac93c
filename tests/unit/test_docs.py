"""The docs ship in the repository and hold together: README.md and docs/**/*.md link only to
files (and headings) that exist, and no tracked file points outside the repository (the
design users rely on is docs/design.md, not a file beside the clone)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# A markdown link's target (the text may span lines), not an image's, not a URL.
LINK = re.compile(r"\]\(([^)\s]+)\)")
# What points outside: a path climbing above the repository, the lead's shared folder, the
# old contract's file name (docs/design.md replaces it).
OUTSIDE = re.compile(r"(?<![\w.])((?:\.\./)+[\w.-][\w./-]*)|/work/|\bshared/|\bDESIGN\.md\b")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.*)", line)):
            base = slug(m[1])
            name, n = base, 0
            while name in found:  # GitHub numbers repeated headings
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not in code blocks
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or not file.is_relative_to(ROOT):
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert broken == []


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## Its `part` (two)\n\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#its-part-two) [x](a.md#not-a-heading) [y](c.md)\n[z](https://e.x)")
    assert links(page) == ["a.md#its-part-two", "a.md#not-a-heading", "c.md"]
    assert anchors(tmp_path / "a.md") == {"a-page", "its-part-two"}


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def outside_references(text: str, folder: Path) -> list[str]:
    """What in `text`, a file's in `folder`, points outside the repository, line by line."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in OUTSIDE.finditer(line):
            climb = m[1]
            target = (folder / climb.rstrip(".,:;")).resolve() if climb else None
            if target and target.is_relative_to(ROOT) and target.exists():
                continue  # a ../ to a file of the repository
            found.append(f"{number}: {m[0]}")
    return found


def test_no_tracked_file_points_outside_the_repository() -> None:
    files = tracked_text_files()
    assert len(files) > 100
    this = Path(__file__).resolve()  # its own patterns and examples say what points outside
    found = [f"{path.relative_to(ROOT)}:{ref}" for path in files if path != this
             for ref in outside_references(path.read_text(errors="replace"), path.parent)]
    assert found == []


@pytest.mark.parametrize(("line", "outside"), [
    ("see ../shared/DESIGN.md", True),
    ("the contract is DESIGN.md (\"Deploy\")", True),
    ("see ../../../x/y.md", True),
    ("cat /work/notes/x", True),
    ("see ../quota/pricing/pricer.py and docs/design.md", False),
])
def test_outside_references_are_found(line: str, outside: bool) -> None:
    assert bool(outside_references(line, ROOT / "docs")) == outside


# Shell blocks in the pages for tenants and operators: each either runs as written in a
# clone or says it is an illustration in its first line (docs/development/README.md,
# "Shell blocks in the docs"). The contract and the generated reference are not such pages.
USER_PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md"))
                                    if p.name not in ("design.md", "configuration.md"))]
ILLUSTRATION = "# illustration"
# Commands of unmarked blocks that need more than a clone, and what runs them.
RUN_ELSEWHERE = {
    "python3 -m venv .venv && . .venv/bin/activate": ".ci/run",  # the same, into .cache/venv
    "pip install --require-hashes -r requirements/runtime.lock": ".ci/run",  # test.lock adds the tools
    "pip install --no-deps --no-build-isolation -e .": ".ci/run",
    "dra-quota demo": "tests/e2e/test_demo.py",
    "bash .ci/run": ".ci/run",
    "kubectl get deviceclasses,resourceslices,namespaces,devicequotas,clusterdevicequotas -A -o json "
    "| dra-quota check -f - -f claims.yaml --fail-on-deny": "tests/e2e/test_check_gate.py",
    "dra-quota check --from-cluster -f claims.yaml --fail-on-deny": "tests/e2e/test_check_gate.py",
}


def shell_blocks(page: Path) -> list[list[str]]:
    """The `sh` blocks of a page (indented ones too), each as its commands: continuation
    lines joined, comments dropped."""
    blocks: list[list[str]] = []
    for body in re.findall(r"^ *```(?:sh|bash|shell)\n(.*?)^ *```", page.read_text(), flags=re.S | re.M):
        lines = [line.strip() for line in body.splitlines()]
        if lines and lines[0].startswith(ILLUSTRATION):
            continue
        joined = re.sub(r"\\\n\s*|\|\n\s*", lambda m: "| " if m[0].startswith("|") else "", "\n".join(lines))
        commands = [re.sub(r"\s+#.*$", "", c).strip() for c in joined.splitlines()]
        blocks.append([re.sub(r"\s+", " ", c) for c in commands if c and not c.startswith("#")])
    return blocks


@pytest.mark.parametrize("page", USER_PAGES, ids=[str(p.relative_to(ROOT)) for p in USER_PAGES])
def test_every_shell_block_runs_or_says_it_is_an_illustration(page: Path) -> None:
    for block in shell_blocks(page):
        for command in block:
            if command in RUN_ELSEWHERE:
                assert (ROOT / RUN_ELSEWHERE[command]).exists()
                continue
            assert command.startswith("dra-quota check ") and "--from-cluster" not in command, (
                f"{page.name}: {command!r} needs more than a clone: start its block with {ILLUSTRATION!r}")
            args = command.split()[1:]
            proc = subprocess.run([sys.executable, "-m", "commands.cli", *args], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, f"{page.name}: {command}: {proc.stderr}"
            assert proc.stdout


def test_shell_blocks_are_read_as_a_user_copies_them(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```sh\n# illustration\nkubectl get dq\n```\n\n  ```sh\n  a \\\n    --b  # c\n"
                    "  # d\n  e |\n    f\n  ```\n")
    assert shell_blocks(page) == [["a --b", "e | f"]]


# The pages for tenants and operators state behaviour; which test proves it, what was
# measured and the history go to docs/development/ (evidence.md page by page). So they
# cite no test or benchmark path but the commands an operator runs, and no tracker issue
# or review round. The contract is the developers' page; the README's section on the test
# suite is about the tests.
READER_PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "design.md")]
README_TEST_SECTIONS = {"What the test suite does outside the clone"}
OPERATOR_COMMANDS = {"tests/tools/build-image.sh", "tests/tools/build-kueue.sh"}
ENGINEERING = re.compile(
    r"(?<![\w./-])(?:tests|bench)/[\w./-]*\w"  # a path in the test suite or the benchmarks
    r"|\b(?:issues?|PR|pull request)\s+#?\d+"  # a tracker's issue
    r"|(?<![\w&/-])#\d+\b"
    r"|\breview(?:ers?)?'?s? rounds?\b|\bround \d+ of (?:the )?review", re.I)


def reader_text(page: Path) -> str:
    """What a page says to its reader: the README without its section on the test suite."""
    if page.name != "README.md":
        return page.read_text()
    kept, skip_below = [], 0
    for line in page.read_text().splitlines():
        if m := re.match(r"(#{1,6}) (.*)", line):
            level = len(m[1])
            if skip_below and level <= skip_below:
                skip_below = 0
            if m[2].strip() in README_TEST_SECTIONS:
                skip_below = level
        kept.append("" if skip_below else line)  # blank, so line numbers stay the file's
    return "\n".join(kept)


def engineering_log(text: str) -> list[str]:
    return [f"{number}: {m[0]}" for number, line in enumerate(text.splitlines(), 1)
            for m in ENGINEERING.finditer(line) if m[0] not in OPERATOR_COMMANDS]


@pytest.mark.parametrize("page", READER_PAGES, ids=[str(p.relative_to(ROOT)) for p in READER_PAGES])
def test_reader_pages_cite_no_test_bench_or_issue(page: Path) -> None:
    assert engineering_log(reader_text(page)) == [], (
        f"{page.relative_to(ROOT)}: move the evidence to docs/development/evidence.md")


@pytest.mark.parametrize(("line", "found"), [
    ("Proven on the real control plane: `tests/e2e/test_extended_resources.py`.", ["tests/e2e/test_extended_resources.py"]),
    ("(`bench/connections.py`).", ["bench/connections.py"]),
    ("run `bash tests/tools/build-image.sh` to build it", []),
    ("delaying everyone else's answer (issues" " 15.2, 15.4)", ["issues" " 15"]),  # split: the code cites none
    ("fixed in #123; see review round 3", ["#123", "review round"]),
    ("see [Reservations](development/reservations.md#leases) and kubernetes/test/e2e/dra/", []),
    ("quota/manifests/ and docs/development/performance.md&#160;(see [x](#x-2))", []),
])
def test_the_engineering_log_is_found(line: str, found: list[str]) -> None:
    assert [hit.split(": ", 1)[1] for hit in engineering_log(line)] == found


def test_the_readme_s_test_suite_section_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        "# R\n\nsee `tests/a.py`\n\n### What the test suite does outside the clone\n\n`tests/b.py`\n\n"
        "#### more\n\n`bench/c.py`\n\n## Install\n\n`tests/d.py`\n")
    page = tmp_path / "README.md"
    assert [hit.split(": ", 1)[1] for hit in engineering_log(reader_text(page))] == ["tests/a.py", "tests/d.py"]
