"""quota.reports.loader: every way input can be hostile gets its true reason and exit 2, no traceback.

Each case is checked twice: the exact CheckInputError message from `load_documents`,
and `dra-quota check` through `commands.cli.main` (exit 2, the message on stderr, nothing
on stdout).
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

import quota.reports.loader as loader
from commands.cli import main
from quota.reports.loader import jsondocs, yamldocs
from quota.reports.loader import CheckInputError, load_documents
from quota.reports.loader.sources import MAX_FILE_BYTES

NS = "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n"
NS_JSON = '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}'
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


def _write(name: str, content: str | bytes) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        path = tmp / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)
    return make


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo.yaml")
    return str(tmp / "fifo.yaml")


def _symlink(target: str, name: str = "link.yaml") -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        (tmp / name).symlink_to(target)
        return str(tmp / name)
    return make


def _symlink_loop(tmp: Path) -> str:
    (tmp / "a.yaml").symlink_to(tmp / "b.yaml")
    (tmp / "b.yaml").symlink_to(tmp / "a.yaml")
    return str(tmp / "a.yaml")


def _folder(*files: str) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        for name in files:
            (tmp / "in" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "in" / name).write_text(NS)
        (tmp / "in").mkdir(exist_ok=True)
        return str(tmp / "in")
    return make


def _unreadable(tmp: Path) -> str:
    (tmp / "secret.yaml").write_text(NS)
    (tmp / "secret.yaml").chmod(0)
    return str(tmp / "secret.yaml")


# (id, path maker, the message after "{path}")
CASES: list[tuple[str, Callable[[Path], str], str]] = [
    ("fifo", _fifo, ": not a regular file (a FIFO); only regular files are read"),
    ("dev-zero", lambda tmp: "/dev/zero", ": not a regular file (a character device); only regular files are read"),
    ("missing", lambda tmp: str(tmp / "nope.yaml"), ": no such file or directory"),
    ("broken-symlink", _symlink("nowhere.yaml"), ": a symlink to nowhere.yaml, which does not exist"),
    ("symlink-loop", _symlink_loop, ": a symlink loop (too many levels of symbolic links)"),
    ("empty-folder", _folder(), ": no .yaml, .yml or .json files under this folder"),
    ("only-hidden", _folder(".git/config.yaml", ".hidden.yaml", "notes.txt"),
     ": no .yaml, .yml or .json files under this folder"),
    ("dup-yaml", _write("d.yaml", "kind: DeviceQuota\nspec:\n  hard: {memory: 1Gi}\n  hard: {memory: 1Ti}\n"),
     ":4: duplicate key 'hard'"),
    ("dup-json", _write("d.json", '{"kind": "DeviceQuota",\n "spec": {"hard": 1,\n  "hard": 2}}'),
     ':3: duplicate key "hard"'),
    ("dup-json-list-top", _write("l.json", '{"items": [], "kind": "List",\n "kind": "List"}'),
     ':2: duplicate key "kind"'),
    ("deep-yaml-block", _write("deep.yaml", "".join("  " * i + "a:\n" for i in range(120)) + "  " * 120 + "b\n"),
     ":101: nested deeper than 100 levels"),
    ("deep-yaml-flow", _write("deep.yaml", "a: " + "[" * 100000 + "]" * 100000 + "\n"),
     ":1: nested deeper than 100 levels"),
    ("deep-json", _write("deep.json", '{"a":\n' + "[" * 5000 + "]" * 5000 + "}"), ":2: nested deeper than 100 levels"),
    ("deep-json-unterminated", _write("deep.json", "[" * 5000 + '"' + "]" * 5000), ":1: nested deeper than 100 levels"),
    ("deep-json-101", _write("deep.json", "[" * 101 + "]" * 101), ":1: nested deeper than 100 levels"),
    ("big-int-yaml", _write("b.yaml", "kind: X\ncount: " + "9" * 4301 + "\n"),
     ":2: integer 99999999999999999999... (4301 characters) is out of range: Kubernetes integers are 64-bit"),
    ("big-int-json", _write("b.json", '{"kind": "X",\n"count": ' + "9" * 4301 + "}"),
     ":2: integer 99999999999999999999... (4301 characters) is out of range: Kubernetes integers are 64-bit"),
    ("int64-overflow", _write("b.yaml", "count: 9223372036854775808\n"),
     ":1: integer 9223372036854775808 is out of range: Kubernetes integers are 64-bit"),
    ("nan-json", _write("n.json", '{"a":\n NaN}'), ":2: NaN is not a JSON number (the API server refuses it)"),
    ("billion-laughs", _write("l.yaml", LAUGHS), ':5: aliases expand this document too much (a "billion laughs")'),
    ("alias-cycle", _write("c.yaml", "a: &x [1, *x]\n"), ":1: an alias refers to a node that contains it"),
    ("not-utf8", _write("l.yaml", b"kind: Namespace\nmetadata: {name: caf\xe9}\n"), ":2: not UTF-8 text (byte 0xe9)"),
    ("utf16", _write("u.yaml", NS.encode("utf-16")), ":1: not UTF-8 text (byte 0xff)"),
    ("binary-tag", _write("b.yaml", "data: !!binary aGk=\n"),
     ":1: tag tag:yaml.org,2002:binary is not allowed in Kubernetes objects"),
    ("set-tag", _write("s.yaml", "a: !!set {x, y}\n"), ":1: tag tag:yaml.org,2002:set is not allowed in Kubernetes objects"),
    ("bad-yaml", _write("x.yaml", "kind: [unclosed\n"), ":2: not valid YAML: did not find expected ',' or ']'"),
    ("surrogate-yaml", _write("s.yaml", 'name: "a\\ud800b"\n'),
     ":1: not valid YAML: found invalid Unicode character escape code"),
    ("bad-json", _write("x.json", '{"kind": }'), ":1: not valid JSON: Expecting value (column 10)"),
    ("too-large", _write("big.yaml", b"#" * (MAX_FILE_BYTES + 1)), ": larger than 256 MiB"),
]


@pytest.mark.parametrize(("make", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_refused_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  make: Callable[[Path], str], message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(CheckInputError) as caught:
        load_documents([path])
    assert str(caught.value) == path + message
    assert main(["check", "-f", path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {path}{message}\n"


def test_permission_denied(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = _unreadable(tmp_path)
    with pytest.raises(CheckInputError, match="^" + path + ": permission denied$"):
        load_documents([path])


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([""], '"": an empty path names no file (use . for the current folder)'),
        (["-", "-"], "-: standard input can be read only once"),
    ],
)
def test_paths_that_name_nothing(paths: list[str], message: str) -> None:
    with pytest.raises(CheckInputError) as caught:
        load_documents(paths)
    assert str(caught.value) == message


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[[bytes], None]]:
    """Replace standard input with a file holding the given bytes."""
    opened: list[io.TextIOWrapper] = []

    def feed(content: bytes) -> None:
        (tmp_path / "stdin").write_bytes(content)
        opened.append(open(tmp_path / "stdin", encoding="utf-8"))  # noqa: SIM115 - closed below
        monkeypatch.setattr(sys, "stdin", opened[-1])

    yield feed
    for handle in opened:
        handle.close()


@pytest.mark.parametrize("content", [NS.encode(), NS_JSON.encode(), b"\xef\xbb\xbf" + NS.encode()])
def test_stdin_yaml_or_json(stdin: Callable[[bytes], None], content: bytes) -> None:
    stdin(content)
    docs, warnings = load_documents(["-"])
    assert [(d.source, d.obj["metadata"]) for d in docs] == [("stdin:1 (document 1)", {"name": "team-a"})]
    assert warnings == []


def test_a_kubectl_list_on_stdin_is_streamed_item_by_item(stdin: Callable[[bytes], None]) -> None:
    dump = {"apiVersion": "v1", "items": [json.loads(NS_JSON)] * 2, "kind": "List", "metadata": {}}
    stdin(json.dumps(dump, indent=4, sort_keys=True).encode())
    docs, _ = load_documents(["-"])
    assert [d.source for d in docs] == ["stdin:4 (document 1, List item 1)", "stdin:11 (document 1, List item 2)"]


@pytest.mark.parametrize(
    ("name", "content", "value"),
    [
        # Go's encoding/json turns a lone surrogate into U+FFFD, so the API server would.
        ("s.json", '{"kind": "Namespace", "metadata": {"name": "a\\ud800b"}}', "a\ufffdb"),
        ("pair.json", '{"kind": "Namespace", "metadata": {"name": "\\ud83d\\ude00"}}', "\U0001f600"),
        ("flow.yaml", "{kind: Namespace, metadata: {name: flow}}", "flow"),
        ("stamp.yaml", "kind: Namespace\nmetadata: {name: 2026-11-23}\n", "2026-11-23"),
    ],
)
def test_values_stay_json_values(tmp_path: Path, name: str, content: str, value: str) -> None:
    (tmp_path / name).write_text(content)
    docs, _ = load_documents([str(tmp_path / name)])
    assert docs[0].obj["metadata"]["name"] == value


@pytest.mark.parametrize(
    "content",
    [
        '{"kind": "Namespace", "metadata": {"name": "a"}}\n---\n{"kind": "Namespace", "metadata": {"name": "b"}}\n',
        '---\n{"kind": "Namespace", "metadata": {"name": "a"}}\n---\n{"kind": "Namespace", "metadata": {"name": "b"}}\n',
        '{"kind": "Namespace", "metadata": {"name": "a"}}\n# and another\n---\n{kind: Namespace, metadata: {name: b}}\n',
    ],
)
def test_json_documents_in_a_yaml_stream_are_yaml(tmp_path: Path, content: str) -> None:
    (tmp_path / "docs.yaml").write_text(content)
    docs, _ = load_documents([str(tmp_path / "docs.yaml")])
    assert [d.obj["metadata"]["name"] for d in docs] == ["a", "b"]


def test_merge_keys_may_override_but_own_keys_may_not_repeat(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("kind: X\nbase: &b {a: 1, c: 3}\nobj:\n  <<: *b\n  a: 2\n")
    docs, _ = load_documents([str(tmp_path / "m.yaml")])
    assert docs[0].obj["obj"] == {"a": 2, "c": 3}
    (tmp_path / "m.yaml").write_text("kind: X\nbase: &b {a: 1}\nobj:\n  <<: *b\n  a: 2\n  a: 3\n")
    with pytest.raises(CheckInputError, match="m.yaml:6: duplicate key 'a'$"):
        load_documents([str(tmp_path / "m.yaml")])


def test_folders_are_walked_sorted_skipping_hidden_and_symlinked_folders(tmp_path: Path) -> None:
    top = Path(_folder("b.yaml", "a/z.yml", ".git/x.yaml", "c.json.txt")(tmp_path))
    (top / "loop").symlink_to(top)
    docs, _ = load_documents([str(top)])
    assert [d.source for d in docs] == [f"{top}/a/z.yml:1 (document 1)", f"{top}/b.yaml:1 (document 1)"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("v.json", "[" + "1," * 20 + "1]", ": more than 10 values in one file"),
        ("v.yaml", "- 1\n" * 20, ":11: more than 10 values in one file"),
    ],
)
def test_values_per_file_are_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     name: str, content: str, message: str) -> None:
    for module in (jsondocs, yamldocs):
        monkeypatch.setattr(module, "MAX_VALUES_PER_FILE", 10)
    for module in (yamldocs, loader):
        monkeypatch.setattr(module, "TOO_MANY_VALUES", "more than 10 values in one file")
    (tmp_path / name).write_text(content)
    with pytest.raises(CheckInputError) as caught:
        load_documents([str(tmp_path / name)])
    assert str(caught.value) == str(tmp_path / name) + message


def test_documents_per_run_are_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loader, "MAX_VALUES", 3)
    (tmp_path / "many.yaml").write_text("---\n" * 5)
    with pytest.raises(CheckInputError) as caught:
        load_documents([str(tmp_path / "many.yaml")])
    assert str(caught.value) == f"{tmp_path}/many.yaml:4: more than 3 documents and List items in all"


@pytest.mark.parametrize(
    ("content", "outcome"),
    [
        (NS, {"name": "team-a"}),
        ('kind: X\nmetadata: {name: "a\\ud800b"}\n', {"name": "a\ufffdb"}),
        ("kind: X\nmetadata: {a: 1, a: 2}\n", "p.yaml:2: duplicate key 'a'"),
        ("kind: X\nmetadata: " + "[" * 200 + "]" * 200 + "\n", "p.yaml:2: nested deeper than 100 levels"),
        (LAUGHS, 'p.yaml:5: aliases expand this document too much (a "billion laughs")'),
    ],
)
def test_without_libyaml_the_same_bounds_hold(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              content: str, outcome: dict[str, str] | str) -> None:
    monkeypatch.setattr(yamldocs, "_Parser", yaml.SafeLoader)
    (tmp_path / "p.yaml").write_text(content)
    if isinstance(outcome, str):
        with pytest.raises(CheckInputError) as caught:
            load_documents([str(tmp_path / "p.yaml")])
        assert str(caught.value) == f"{tmp_path}/{outcome}"
    else:
        docs, _ = load_documents([str(tmp_path / "p.yaml")])
        assert docs[0].obj["metadata"] == outcome
