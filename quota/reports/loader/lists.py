"""`List` documents: `kind: List` (kubectl -o json/yaml) and typed Lists (`ResourceSliceList`).

Neighbours: `quota.reports.loader.yamldocs` and `quota.reports.loader.jsondocs` hand a List's items out
one by one through `item`; `quota.reports.loader` expands what they did not stream the same way.

kubectl prints several objects as `kind: List`, each item carrying its own kind and
apiVersion. The API server (`kubectl get --raw /apis/...`) and the client libraries print
a collection as its typed List (`ResourceSliceList`, `DeviceQuotaList`), whose items
carry neither: the List's kind without `List` and its apiVersion are theirs, as the API
server's decoder reads them (apimachinery runtime/serializer: a typed list's items are
decoded into the list's item type).
"""

from __future__ import annotations

from typing import Any, TypeGuard

__all__ = ["is_list_kind", "item"]

_LIST = "List"


def is_list_kind(kind: Any) -> TypeGuard[str]:
    """`List`, or a typed List `<Kind>List`."""
    return isinstance(kind, str) and kind.endswith(_LIST) and (kind == _LIST or kind[0].isupper())


def item(value: Any, kind: str, api_version: Any) -> Any:
    """One item of a List of `kind` and `api_version`; a typed List's items get the kind
    and apiVersion it implies where they carry none (the item is the decoder's own: changed in place)."""
    if kind == _LIST or not isinstance(value, dict):
        return value
    if "kind" not in value:
        value["kind"] = kind[: -len(_LIST)]
    if "apiVersion" not in value and isinstance(api_version, str):
        value["apiVersion"] = api_version
    return value
