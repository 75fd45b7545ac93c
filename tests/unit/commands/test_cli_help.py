"""Every flag of every command says what it does in `--help` (and so in docs/configuration.md,
generated from it): a flag listed bare leaves its reader to guess."""
from __future__ import annotations

import argparse
from collections.abc import Iterator

from commands.cli import _parser


def _bare(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _bare(sub, f"{path} {name}")
        elif not action.help and not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_flag_has_help() -> None:
    assert list(_bare(_parser(), "dra-quota")) == []
