"""`--cert-mode self`: `certs.manager` wired to the Kubernetes API, and its flags.

Neighbours: `certs.manager.CertificateManager` runs the loop against the `Store`
protocol; `KubeStore` here is that store over `kube.api` (the Secret in the
server's namespace, our Validating/MutatingWebhookConfigurations); `commands.serve`
calls `start` before it listens and runs `manager.run()` beside the server;
`commands.servecommand` adds the flags with `add_arguments`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from certs.authority import SERVICE, KeyPair, service_names
from certs.manager import CertificateManager, Conflict, Secret, WebhookConfiguration
from certs.rotation import Policy
from certs.tls import ReloadingContext
from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import MUTATING_WEBHOOKS, SECRETS, VALIDATING_WEBHOOKS

__all__ = ["KubeStore", "SelfManaged", "add_arguments", "default_namespace", "from_args", "parse_duration", "start"]

log = logging.getLogger(__name__)

CONFIGURATIONS = {"validating": VALIDATING_WEBHOOKS, "mutating": MUTATING_WEBHOOKS}
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# (kind, name): the names deploy/manifests/webhooks.yaml gives both configurations.
DEFAULT_CONFIGURATIONS = (("validating", "dra-quota"), ("mutating", "dra-quota"))
_DEFAULTS = Policy(dns_names=("-",))
# The first pass runs before the server listens; a transient API failure is retried
# this many times (1, 2, 4, 8 s apart) before start-up fails and the Pod restarts.
_START_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class SelfManaged:
    namespace: str
    service_name: str = "dra-quota-webhook"
    secret_name: str = "dra-quota-webhook-tls"
    configurations: tuple[tuple[str, str], ...] = DEFAULT_CONFIGURATIONS
    check_period: timedelta = timedelta(hours=1)
    trust_delay: timedelta = timedelta(seconds=60)
    ca_validity: timedelta = _DEFAULTS.ca_validity
    ca_renew_before: timedelta = _DEFAULTS.ca_renew_before
    serving_validity: timedelta = _DEFAULTS.serving_validity
    serving_renew_before: timedelta = _DEFAULTS.serving_renew_before
    labels: Mapping[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name": "dra-quota",
                                                               "app.kubernetes.io/component": "webhook"})

    def policy(self) -> Policy:
        return Policy(dns_names=service_names(self.service_name, self.namespace), ca_validity=self.ca_validity,
                      ca_renew_before=self.ca_renew_before, serving_validity=self.serving_validity,
                      serving_renew_before=self.serving_renew_before)


class KubeStore:
    """`certs.manager.Store` over the API: 409 (and 404 under a precondition) -> `Conflict`."""

    def __init__(self, api: KubeApi, options: SelfManaged) -> None:
        self.api, self.options = api, options
        self._type = "kubernetes.io/tls"  # the type is immutable: a replace keeps what was read

    async def read_secret(self) -> Secret | None:
        try:
            obj = await self.api.get(SECRETS, self.options.secret_name, namespace=self.options.namespace)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        self._type = obj.get("type") or "Opaque"
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        return Secret(data, obj["metadata"]["resourceVersion"])

    def _body(self, data: Mapping[str, bytes], resource_version: str | None) -> dict[str, object]:
        metadata: dict[str, object] = {"name": self.options.secret_name, "namespace": self.options.namespace,
                                       "labels": dict(self.options.labels)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": self._type,
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}

    async def create_secret(self, data: Mapping[str, bytes]) -> None:
        await self._write(self.api.create(SECRETS, self._body(data, None), namespace=self.options.namespace))

    async def replace_secret(self, data: Mapping[str, bytes], resource_version: str) -> None:
        await self._write(self.api.replace(SECRETS, self._body(data, resource_version),
                                           namespace=self.options.namespace))

    async def read_configurations(self) -> Sequence[WebhookConfiguration]:
        found = []
        for kind, name in self.options.configurations:
            try:
                obj = await self.api.get(CONFIGURATIONS[kind], name)
            except ApiError as err:
                if err.status == 404:
                    continue  # not installed (yet): nothing calls us through it
                raise
            bundles = {h["name"]: base64.b64decode((h.get("clientConfig") or {}).get("caBundle") or "")
                       for h in obj.get("webhooks") or []}
            found.append(WebhookConfiguration(kind, name, obj["metadata"]["resourceVersion"], bundles))
        return found

    async def patch_bundle(self, configuration: WebhookConfiguration, bundle: bytes) -> None:
        # Strategic merge: `webhooks` merges by name, so only caBundle changes, whatever
        # else a concurrent writer did; resourceVersion makes it conditional on what we read.
        encoded = base64.b64encode(bundle).decode()
        patch = {"metadata": {"resourceVersion": configuration.resource_version},
                 "webhooks": [{"name": n, "clientConfig": {"caBundle": encoded}} for n in configuration.bundles]}
        await self._write(self.api.patch(CONFIGURATIONS[configuration.kind], configuration.name, patch,
                                         patch_type="strategic"))

    @staticmethod
    async def _write(call: object) -> None:
        assert asyncio.iscoroutine(call)
        try:
            await call
        except ApiError as err:
            if err.status in (404, 409):
                raise Conflict(str(err)) from None
            raise


async def start(api: KubeApi, options: SelfManaged) -> tuple[ReloadingContext, CertificateManager]:
    """The first pass (the Secret exists, the caBundles are set) and the context serving its leaf."""
    contexts: list[ReloadingContext] = []

    def on_serving(pair: KeyPair) -> None:
        if contexts:
            contexts[0].update(pair)

    manager = CertificateManager(KubeStore(api, options), options.policy(), on_serving,
                                 period=options.check_period, trust_delay=options.trust_delay)
    for attempt in range(_START_ATTEMPTS):
        try:
            material = await manager.reconcile()
            break
        except (ApiError, Conflict, OSError) as err:
            if attempt == _START_ATTEMPTS - 1:
                raise
            log.warning("certificate set-up failed (%s); retrying", err)
            await asyncio.sleep(2.0 ** attempt)
    contexts.append(ReloadingContext(material.serving))
    return contexts[0], manager


# -- flags --------------------------------------------------------------------------------------

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> timedelta:
    """`90d`, `12h`, `1h30m`, `45s`, `2.5s` or plain seconds."""
    text = text.strip()
    try:
        return _positive(timedelta(seconds=float(text)), text)
    except ValueError:
        pass
    parts = re.findall(r"(\d+(?:\.\d+)?)([dhms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90d, 12h, 1h30m, 45s)")
    return _positive(timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts)), text)


def _positive(value: timedelta, text: str) -> timedelta:
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return value


def _configurations(text: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, _, name = item.rpartition("/")
        if kind and kind not in CONFIGURATIONS:
            raise argparse.ArgumentTypeError(f"{item!r}: kind must be validating or mutating")
        out += [(k, name) for k in ([kind] if kind else list(CONFIGURATIONS))]
    return tuple(out)


def default_namespace() -> str:
    try:
        return NAMESPACE_FILE.read_text().strip() or "dra-quota-system"
    except OSError:
        return "dra-quota-system"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("self-managed certificates (--cert-mode self)")
    group.add_argument("--namespace", help="namespace of the Service and the Secret "
                                           "(default: the Pod's namespace, else dra-quota-system)")
    group.add_argument("--service-name", default=SERVICE,
                       help=f"Service the API server calls: the certificate names <svc>.<ns>.svc (default {SERVICE})")
    group.add_argument("--cert-secret", default="dra-quota-webhook-tls",
                       help="Secret holding ca.crt, ca.key, tls.crt, tls.key (default dra-quota-webhook-tls)")
    group.add_argument("--webhook-configurations", type=_configurations, default=DEFAULT_CONFIGURATIONS,
                       metavar="NAMES", help="comma list of [validating/|mutating/]NAME whose caBundle we set; a bare "
                                             "NAME means both kinds (default dra-quota)")
    group.add_argument("--cert-check-period", type=parse_duration, default=timedelta(hours=1), metavar="DURATION",
                       help="how often the Secret and caBundles are checked (default 1h; renewals also wake it)")
    group.add_argument("--ca-trust-delay", type=parse_duration, default=timedelta(seconds=60), metavar="DURATION",
                       help="how long a new CA must be in every caBundle before the leaf moves to it (default 60s)")
    for flag, default in (("--ca-validity", _DEFAULTS.ca_validity), ("--ca-renew-before", _DEFAULTS.ca_renew_before),
                          ("--cert-validity", _DEFAULTS.serving_validity),
                          ("--cert-renew-before", _DEFAULTS.serving_renew_before)):
        group.add_argument(flag, type=parse_duration, default=default, metavar="DURATION",
                           help=f"default {default.days}d")


def from_args(args: argparse.Namespace) -> SelfManaged:
    """Raises ValueError when a renew-before is not shorter than its validity."""
    options = SelfManaged(
        namespace=args.namespace or default_namespace(), service_name=args.service_name,
        secret_name=args.cert_secret, configurations=args.webhook_configurations,
        check_period=args.cert_check_period, trust_delay=args.ca_trust_delay,
        ca_validity=args.ca_validity, ca_renew_before=args.ca_renew_before,
        serving_validity=args.cert_validity, serving_renew_before=args.cert_renew_before,
    )
    options.policy()  # validates
    return options
