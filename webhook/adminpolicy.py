"""The adminAccess allowlist in force, kept current without a restart.

Neighbours: `quota.admission.policy` parses and judges (pure); `webhook.claimreview` and
`webhook.namespaces` read the policy in force at each review (`ClaimContext.policy` is
`PolicySource.policy`); `commands.serve` runs one of the two sources:

- `--admin-access-configmap NAMESPACE/NAME`: the ConfigMap, watched through the API by
  a `kube.watching.Reflector` with the field selector `metadata.name=NAME`, so RBAC can
  grant get/list/watch on that one object by resourceNames (the API server takes the
  name of a list or watch from that selector). It is the parameter object of the
  shipped ValidatingAdmissionPolicy (deploy/manifests/admin-access-policy.yaml): one
  edit changes both. A change applies as soon as the watch delivers it.
- `--admin-access-policy PATH`: a YAML/JSON map (or a ConfigMap manifest) in a file, or
  a directory holding one file per key (a ConfigMap mounted as a volume), polled on
  disk by `runtime.filepoll` like the certificate pair.

Failure behaviour, the same for both, and never fail open: a new version that does not
parse is ignored with a warning naming the field, the policy in force stays; a
ConfigMap that does not exist (or was deleted) is an empty allowlist, so nobody may use
or grant adminAccess until it is back, as the ValidatingAdmissionPolicy, whose binding
denies when its parameter is missing (parameterNotFoundAction Deny). Only a bad file
at start-up is an error (the operator is there to see it); the ConfigMap is read after
start-up, and a typo in it must not crash-loop every replica of a failurePolicy Fail
webhook.
"""

from __future__ import annotations

import logging
from argparse import ArgumentTypeError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube.api import KubeApi
from kube.resources import CONFIGMAPS
from kube.watching import Reflector
from quota.admission.policy import AdminAccessPolicy, PolicyError, parse_policy
from quota.reports.loader import CheckInputError, read_values
from quota.values.raw import Obj, show
from quota.values.validation import dns_label, dns_subdomain
from runtime.filepoll import Stamp, reload_on_change, stamp

__all__ = ["ConfigMapPolicy", "PolicySource", "configmap_ref", "read_policy"]

log = logging.getLogger(__name__)

# A ConfigMap holds at most 1 MiB (k/k pkg/apis/core/validation, MaxSecretSize); a
# mounted key larger than that is not one.
_MAX_FILE = 1 << 20
NOBODY = parse_policy({})


def configmap_ref(text: str) -> tuple[str, str]:
    """`NAMESPACE/NAME` of `--admin-access-configmap` (an argparse type: its error is shown as is)."""
    namespace, sep, name = text.partition("/")
    if not sep:
        raise ArgumentTypeError(f"{show(text)} must be NAMESPACE/NAME")
    return (dns_label(namespace, "the ConfigMap's namespace", ArgumentTypeError),
            dns_subdomain(name, "the ConfigMap's name", ArgumentTypeError))


def read_policy(path: Path) -> AdminAccessPolicy:
    """The policy in a file (a map, or a ConfigMap manifest's `data`) or a directory of keys.

    PolicyError names the path and what is wrong.
    """
    if path.is_dir():
        return _parse(_mounted(path), str(path))
    try:
        # The loader `check` uses: a duplicate `users:` key, say, is refused rather than
        # silently dropping one of the two lists.
        values = read_values(str(path))
    except CheckInputError as err:
        raise PolicyError(str(err)) from None
    if len(values) > 1:
        raise PolicyError(f"{path}: one document expected, found {len(values)}")
    raw = values[0] if values else None
    if isinstance(raw, dict) and raw.get("kind") == "ConfigMap":
        raw = raw.get("data") or {}
    return _parse(raw if raw is not None else {}, str(path))


def _mounted(directory: Path) -> dict[str, str]:
    """A ConfigMap volume: one file per key, beside kubelet's hidden `..data` links."""
    data = {}
    try:
        for entry in sorted(directory.iterdir()):
            if entry.name.startswith("."):
                continue
            with entry.open("rb") as f:
                content = f.read(_MAX_FILE + 1)
            if len(content) > _MAX_FILE:
                raise PolicyError(f"{entry}: larger than a ConfigMap can be ({_MAX_FILE} bytes)")
            data[entry.name] = content.decode("utf-8")
    except OSError as err:
        raise PolicyError(f"{directory}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{entry}: not UTF-8 text") from None
    return data


def _parse(raw: Any, where: str) -> AdminAccessPolicy:
    try:
        return parse_policy(raw)
    except PolicyError as err:
        raise PolicyError(f"{where}: {err}") from None


def _stamp(path: Path) -> Stamp:
    """A file's stamp; a directory's covers its keys too (edited in place, its own mtime stays)."""
    if not path.is_dir():
        return stamp(path)
    return stamp(path, *sorted(e for e in path.iterdir() if not e.name.startswith(".")))


def _summary(policy: AdminAccessPolicy) -> str:
    return (f"allowlisted: users={len(policy.users)} groups={len(policy.groups)} "
            f"serviceAccounts={len(policy.service_accounts)}")


@dataclass(eq=False)
class PolicySource:
    """The policy in force (`policy()`), and what keeps it current."""

    current: AdminAccessPolicy = NOBODY
    origin: str = "no --admin-access-policy or --admin-access-configmap: nobody is allowlisted"
    path: Path | None = None
    configmap: tuple[str, str] | None = None
    poll_seconds: float = 5.0
    _since: Stamp = field(default=(), init=False, repr=False)

    @classmethod
    def from_file(cls, path: Path, *, poll_seconds: float = 5.0) -> PolicySource:
        """Read now (PolicyError when it cannot be read); `poll()` then reloads it."""
        source = cls(path=path, poll_seconds=poll_seconds)
        try:
            since = _stamp(path)  # before reading: a change made while it is read is not missed
        except OSError as err:
            raise PolicyError(f"{path}: {err.strerror or err}") from None
        source.use(read_policy(path), str(path))
        source._since = since
        return source

    @classmethod
    def from_configmap(cls, namespace: str, name: str) -> PolicySource:
        """Nobody until the reflector (`reflectors`) has listed the ConfigMap."""
        return cls(configmap=(namespace, name), origin=f"ConfigMap {namespace}/{name} not read yet")

    def policy(self) -> AdminAccessPolicy:
        return self.current

    def use(self, policy: AdminAccessPolicy, origin: str) -> None:
        if policy != self.current or origin != self.origin:
            log.info("adminAccess policy from %s: %s", origin, _summary(policy))
        self.current, self.origin = policy, origin

    def keep(self, problem: str) -> None:
        """A new version that does not parse: say so, and change nothing."""
        log.warning("adminAccess policy not reloaded: %s; keeping the one from %s (%s)",
                    problem, self.origin, _summary(self.current))

    def reflectors(self, api: KubeApi) -> list[Reflector]:
        if self.configmap is None:
            return []
        namespace, name = self.configmap
        return [Reflector(api, CONFIGMAPS, ConfigMapPolicy(self, namespace, name), namespace=namespace,
                          field_selector=f"metadata.name={name}")]

    async def poll(self) -> None:
        """Reload the file when it changes on disk; returns at once without a file."""
        if self.path is None:
            return
        path = self.path

        def reload() -> None:
            self.use(read_policy(path), str(path))

        # PolicyError is a ValueError: an invalid policy keeps the current one.
        await reload_on_change(lambda: _stamp(path), self.poll_seconds, self._since, reload, "the adminAccess policy")


@dataclass(eq=False)
class ConfigMapPolicy:
    """The `kube.watching.Store` of the one ConfigMap: its `data` becomes the policy in force."""

    source: PolicySource
    namespace: str
    name: str

    def replace(self, objects: list[Obj]) -> None:
        mine = [o for o in objects if (o.get("metadata") or {}).get("name") == self.name]
        if mine:
            self.upsert(mine[0])
        else:
            self._missing("not found")

    def upsert(self, obj: Obj) -> None:
        if (obj.get("metadata") or {}).get("name") != self.name:
            return
        where = f"ConfigMap {self.namespace}/{self.name} (resourceVersion {(obj.get('metadata') or {}).get('resourceVersion')})"
        try:
            policy = parse_policy(obj.get("data") or {})
        except PolicyError as err:
            self.source.keep(f"{where}: {err}")
            return
        self.source.use(policy, where)

    def delete(self, obj: Obj) -> None:
        if (obj.get("metadata") or {}).get("name") == self.name:
            self._missing("deleted")

    def _missing(self, what: str) -> None:
        origin = f"ConfigMap {self.namespace}/{self.name} ({what})"
        if self.source.origin != origin:
            log.warning("%s: nobody may use or grant adminAccess until it exists", origin)
        self.source.use(NOBODY, origin)
