"""The installed distribution's version: what `dra-quota --version` prints and
`draquota_build_info` exports (`webhook.metrics`). No other import: the CLI asks at start."""

from __future__ import annotations

from importlib import metadata

__all__ = ["version"]


def version() -> str:
    """`dra-quota`'s version as installed, "unknown" when it is not (run from a bare checkout)."""
    try:
        return metadata.version("dra-quota")
    except metadata.PackageNotFoundError:
        return "unknown"
