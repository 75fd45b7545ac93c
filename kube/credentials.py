"""Which credentials a command uses to reach the API server: one rule for every command.

Neighbours: `kube.api.KubeApi.connect` loads what `resolve` chooses (through
kubernetes_asyncio's kubeconfig and in-cluster loaders); `serve` and `top` call
`connect`, so both find a cluster the same way. No network here, only the environment
and the files it names.

The order, first that applies:
1. `--kubeconfig FILE`: that file alone (it must exist);
2. `$KUBECONFIG`: a colon-separated list; the files that exist are merged as kubectl
   merges them (client-go clientcmd loader.go: empty and missing entries skipped; for
   clusters, users and contexts the first file to define a name wins; the first file
   to set `current-context` chooses it). A list naming no existing file is an error
   outside a Pod, as it is for kubectl: ~/.kube/config is not read then;
3. in a Pod (`KUBERNETES_SERVICE_HOST` and `_PORT` set): its service account (unless
   a `--context` is asked for: only a kubeconfig has contexts);
4. `~/.kube/config`.
One deliberate difference from kubectl: kubectl reads ~/.kube/config before trying the
service account, so a file left in a Pod's home would win there; `serve` runs in Pods,
where the service account is the identity its RBAC was written for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

__all__ = ["Credentials", "CredentialsError", "resolve"]

# A kubeconfig is a few KiB; reading more to find `current-context` would be a stray file.
_MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024


class CredentialsError(Exception):
    """No usable credentials; the message says what was looked for."""


@dataclass(frozen=True, slots=True)
class Credentials:
    kind: Literal["kubeconfig", "in-cluster"]
    # Kubeconfig files in merge order (empty for in-cluster).
    files: tuple[str, ...] = ()
    # The context to use: the flag's, else the first `current-context` the files set.
    context: str | None = None
    source: str = ""  # how they were chosen, for logs: "--kubeconfig", "$KUBECONFIG", ...

    def describe(self) -> str:
        if self.kind == "in-cluster":
            return "the Pod's service account (in-cluster)"
        context = f", context {self.context}" if self.context else ""
        return f"kubeconfig {os.pathsep.join(self.files)} ({self.source}{context})"


def resolve(kubeconfig: str | None = None, *, context: str | None = None,
            environ: Mapping[str, str] | None = None, home: Path | None = None) -> Credentials:
    """The credentials of the module doc's order; CredentialsError when none apply."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        path = os.path.expanduser(kubeconfig)
        if not os.path.isfile(path):
            raise CredentialsError(f"--kubeconfig {kubeconfig}: no such file")
        return _kubeconfig((path,), context, "--kubeconfig")
    listed = env.get("KUBECONFIG", "")
    files = tuple(dict.fromkeys(p for entry in listed.split(os.pathsep)
                                if entry and os.path.isfile(p := os.path.expanduser(entry))))
    if files:
        return _kubeconfig(files, context, "$KUBECONFIG")
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT") and context is None:
        return Credentials("in-cluster", source="in-cluster")
    if listed:
        raise CredentialsError(f"$KUBECONFIG={listed}: none of these files exists")
    default = (home or Path.home()) / ".kube" / "config"
    if default.is_file():
        return _kubeconfig((str(default),), context, "~/.kube/config")
    raise CredentialsError("no credentials: pass --kubeconfig, set $KUBECONFIG, run in a Pod (its service "
                           f"account), or write {default}")


def _kubeconfig(files: tuple[str, ...], context: str | None, source: str) -> Credentials:
    return Credentials("kubeconfig", files, context or _current_context(files), source)


def _current_context(files: Sequence[str]) -> str | None:
    """The first non-empty `current-context` the files set (client-go's merge rule)."""
    for path in files:
        try:
            with open(path, "rb") as handle:
                config = yaml.safe_load(handle.read(_MAX_KUBECONFIG_BYTES))
        except (OSError, yaml.YAMLError) as err:
            raise CredentialsError(f"kubeconfig {path}: {err}") from None
        current = config.get("current-context") if isinstance(config, dict) else None
        if isinstance(current, str) and current:
            return current
    return None
