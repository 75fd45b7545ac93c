"""`dra-quota selftest`: send one dry-run ResourceClaim through the API server and say
whether dra-quota's admission webhook answered it (the chart's `helm test` Pod runs it).

Neighbours: `commands.cli` lists the subcommand and calls `add_arguments`; the client is
`kube.api.KubeApi.connect`, as `top` finds the cluster. Nothing is written: the create is
a dry run (`dryRun=All`), which the webhooks see with `dryRun: true` and answer without
reserving anything (`sideEffects: NoneOnDryRun`; `webhook.claimadmit` writes no token).

What counts as an answer, read from the API server's response alone (the Pod's account
may create claims in one namespace and read nothing else):
- the claim comes back carrying `draquota.io/charge`: the mutating `/admit` webhook
  priced it (the claim requests no device, so it charges nothing and fits any quota);
- the create is refused with `admission webhook "<ours>" denied the request`: a
  dra-quota webhook decided.
Anything else fails, with the likely cause: a claim admitted without the annotation was
never sent to the webhook (no configuration, a namespaceSelector that leaves the
namespace out) or was sent and the call failed under `failurePolicy: Ignore` (every
namespace no DeviceQuota governs); `failed calling webhook` is the call failing under
`Fail`.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from commands.commandflags import KUBECONFIG_HELP, Subparsers
from quota.objects.claims import CHARGE_ANNOTATION, QUOTAS_ANNOTATION
from quota.reports.printable import for_terminal

if TYPE_CHECKING:
    from kube.apierror import ApiError
    from quota.values.raw import Obj

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNABLE", "Outcome", "add_arguments", "judge_admitted", "judge_refused"]

EXIT_OK = 0  # a dra-quota webhook answered the dry-run claim
EXIT_FAILED = 1  # it did not: not called, or called and failed
EXIT_UNABLE = 2  # the selftest could not ask: no credentials, API server unreachable, not allowed
DEFAULT_NAMESPACE = "default"
# Every webhook of ours is named <hook>.<resource>.draquota.io (deploy/manifests/webhooks.yaml).
_OURS = re.compile(r'admission webhook "(?P<hook>[^"]+\.draquota\.io)" denied the request')
_FAILED_CALL = re.compile(r'failed calling webhook "(?P<hook>[^"]+\.draquota\.io)"')
_NOT_CALLED = (
    "no dra-quota webhook answered for namespace {ns}: the API server admitted the dry-run ResourceClaim without "
    f"the {CHARGE_ANNOTATION} annotation the webhook adds. Either no webhook configuration selects {{ns}} (the "
    "chart's MutatingWebhookConfiguration is missing, or {ns} is the release namespace, one of "
    "webhooks.excludeNamespaces, or lacks the label webhooks.optInLabel names), or the webhook was called and "
    "failed under failurePolicy: Ignore (dra-quota serve not running or not ready, a NetworkPolicy or the "
    "certificate refusing the API server's call; `kubectl get pods` in the release namespace and the API "
    "server's log say which)"
)



@dataclass(frozen=True, slots=True)
class Outcome:
    """The selftest's verdict: its exit code and the line that says why."""

    code: int
    message: str


def add_arguments(sub: Subparsers, *, summary: str) -> None:
    selftest = sub.add_parser(
        "selftest", help=summary,
        description="Create a ResourceClaim that requests no device, as a dry run (nothing is stored or "
                    "reserved), in a namespace dra-quota's webhooks are called for, and check that a dra-quota "
                    f"webhook answered: the claim comes back with the {CHARGE_ANNOTATION} annotation, or is "
                    "denied by a *.draquota.io webhook. The chart's `helm test` runs it. Needs create on "
                    "resourceclaims in that namespace. Exit 0 when the webhook answered, 1 when it did not "
                    "(the message says the likely cause), 2 when the claim could not be sent (credentials, "
                    "API server, RBAC, no such namespace).")
    selftest.add_argument("-n", "--namespace", default=DEFAULT_NAMESPACE,
                          help="where to send the claim: a namespace the webhooks are called for, so not "
                               "dra-quota's own namespace, which they exclude (default default)")
    selftest.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)
    selftest.add_argument("--context", help="kubeconfig context (default: the current one)")
    selftest.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    outcome = asyncio.run(_selftest(args.namespace, kubeconfig=args.kubeconfig, context=args.context))
    print(("ok: " if outcome.code == EXIT_OK else "error: ") + for_terminal(outcome.message),
          file=sys.stdout if outcome.code == EXIT_OK else sys.stderr)
    return outcome.code


def probe_claim() -> Obj:
    """The claim sent: no device requested, so no quota is charged and no DeviceClass is
    needed; a generated name, so it never collides with a real claim."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"generateName": "dra-quota-selftest-",
                         "labels": {"app.kubernetes.io/name": "dra-quota-selftest"}},
            "spec": {"devices": {"requests": []}}}


async def _selftest(namespace: str, *, kubeconfig: str | None, context: str | None) -> Outcome:
    import aiohttp

    from kube.api import KubeApi
    from kube.apierror import ApiError
    from kube.loaders import ConfigException
    from kube.resources import CLAIMS

    try:
        async with await KubeApi.connect(kubeconfig, context=context) as api:
            created = await api.create(CLAIMS, probe_claim(), namespace=namespace, dry_run=True)
    except ApiError as err:
        return judge_refused(err, namespace)
    except ConfigException as err:
        return Outcome(EXIT_UNABLE, f"cannot reach the cluster: {err}")
    except (OSError, aiohttp.ClientError, TimeoutError) as err:
        return Outcome(EXIT_UNABLE, f"cannot reach the API server: {err or type(err).__name__}")
    return judge_admitted(created, namespace)


def judge_admitted(claim: Obj, namespace: str) -> Outcome:
    """The API server admitted the dry-run claim: did our mutating webhook price it?"""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    charge = annotations.get(CHARGE_ANNOTATION)
    if charge is None:
        return Outcome(EXIT_FAILED, _NOT_CALLED.format(ns=namespace))
    quotas = annotations.get(QUOTAS_ANNOTATION) or "none"
    return Outcome(EXIT_OK, f"the dra-quota webhook admitted a dry-run ResourceClaim in namespace {namespace} "
                            f"({CHARGE_ANNOTATION}={charge}, quotas charged: {quotas})")


def judge_refused(err: ApiError, namespace: str) -> Outcome:
    """The API server refused the dry-run claim: one of our webhooks, its call, or not ours."""
    if (ours := _OURS.search(err.message)) is not None:
        return Outcome(EXIT_OK, f"the dra-quota webhook {ours['hook']} answered a dry-run ResourceClaim in "
                                f"namespace {namespace} (denied: {err.message})")
    if (failed := _FAILED_CALL.search(err.message)) is not None:
        return Outcome(EXIT_FAILED, f"the API server called the dra-quota webhook {failed['hook']} for namespace "
                                    f"{namespace} and got no answer (failurePolicy: Fail): is dra-quota serve "
                                    f"running and ready? {err.message}")
    if err.status == 404:
        return Outcome(EXIT_UNABLE, f"cannot send the claim: {err.message} (--namespace names an existing "
                                    "namespace the webhooks are called for)")
    if err.status in (401, 403) and "admission webhook" not in err.message:
        return Outcome(EXIT_UNABLE, f"not allowed to create a dry-run ResourceClaim in namespace {namespace} "
                                    f"(needs create on resourceclaims there): {err.message}")
    return Outcome(EXIT_FAILED, f"the dry-run ResourceClaim in namespace {namespace} was refused, not by a "
                                f"dra-quota webhook, so whether one was reached is unknown: {err}")
