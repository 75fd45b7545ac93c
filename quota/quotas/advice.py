"""What a requester refused by a full quota can do: the sentence after the in-tree numbers.

Neighbours: `quota.quotas.devicequota.check` writes each Enforce quota's denial in the in-tree
form (`exceeded DeviceQuota "gpus": requested ..., limited ...`) and appends, after all of
them, this advice for each; every path that decides against a quota goes through it (a
claim's admission, a template's fit, an allocation's excess, a Kueue Workload's check).
`quota.admission.explain` may add, after it, why the claim is priced as it is. Pure.

The in-tree form comes first and stays as it is: queue managers and people grep it, and
a cut log line or Event note keeps its beginning. The advice says what the requester can
do and what to ask the cluster admin for, whose object a quota is:
- `full`: free room where the quota counts (the namespace, or the team's namespaces);
- `reserved`: what is used leaves room for the request, claims not allocated yet hold the
  rest: they hold it at their estimate until they are allocated (then charged what they
  got, which may be less) or deleted. "It frees once they are allocated" would be wrong
  where the estimate is exact;
- `never`: the request alone is over the limit, so freeing room cannot help;
- `window`: the request alone is over a limit a window put in force, and within the
  quota's own: freeing room cannot help now, the window's end will.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["Case", "advice", "case_of", "worst"]

Case = Literal["full", "reserved", "never", "window"]


def case_of(*, requested: int, used: int, limited: int, own: int | None = None) -> Case:
    """Why one exceeded resource does not fit (`used + reserved + requested > limited`);
    `own`: the quota's own limit when a window's is in force (`limited`)."""
    if requested > limited:
        return "window" if own is not None and requested <= own else "never"
    return "reserved" if used + requested <= limited else "full"


def worst(cases: list[Case]) -> Case:
    """A quota's case over its exceeded resources: one that can never fit decides, and room
    is only reserved when it is so for every one."""
    for alone in ("never", "window"):
        if alone in cases:
            return alone
    return "reserved" if cases and all(c == "reserved" for c in cases) else "full"


def advice(*, kind: str, name: str, team: bool, namespace: str, case: Case) -> str:
    """The sentence for quota `kind` "`name`" that denied a request from `namespace` ("" when
    the caller does not know it; a DeviceQuota's own namespace is the requester's)."""
    ask = f'ask the cluster admin to raise the limit of {kind} "{name}"'
    if case == "never":
        return f"requested alone is over the limit: make the request smaller, or {ask}"
    if case == "window":
        return (f"requested alone is over the limit a window put in force, not over the quota's own: "
                f"retry once the window ends, make the request smaller, or {ask}")
    see = f"kubectl get acdq -n {namespace}" if namespace else "kubectl get acdq"
    notes = [f"its namespaces share this limit: {see}"] if team else []
    if case == "reserved":
        notes.append("claims not allocated yet hold the room at their estimate until they are allocated or deleted")
    elif not team:
        notes.append("delete claims it no longer needs")
    where = f'team "{name}"' if team else f"namespace {namespace}"
    return f"to fit, free room in {where} ({'; '.join(notes)}) or {ask}"
