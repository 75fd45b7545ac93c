"""kubernetes_asyncio's kubeconfig and in-cluster loaders, without its generated API.

Neighbours: `kube.api` takes `Configuration`, `ConfigException`,
`load_kube_config` and `load_incluster_config` from here and nothing else of the library
(its own aiohttp client does the requests).

Why: `import kubernetes_asyncio.config` runs `kubernetes_asyncio/__init__.py` and
`kubernetes_asyncio/client/__init__.py`, which import every generated API and model
class (about 700 modules: 0.45 s of CPU on a busy 2-core machine, a third of what
`dra-quota top` spent in all), none of which this client uses. The loaders need only
`client.configuration.Configuration` (and name `client.ApiClient` for a function we
never call). So, when nothing has imported the library yet, its two packages are
registered as *deferred* modules: their submodules import as usual, and their own
`__init__` runs the first time anyone asks them for a name they do not have yet
(`kubernetes_asyncio.client.CoreV1Api`, `kubernetes_asyncio.__version__`), in the same
module, so code elsewhere in the process that wants the whole library still gets it.
Measured by bench/cli.py; tests/unit/kube/test_loaders.py checks both halves.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

__all__ = ["ConfigException", "Configuration", "SERVICE_CERT_FILENAME", "SERVICE_TOKEN_FILENAME",
           "load_incluster_config", "load_kube_config"]

_ROOT, _CLIENT = "kubernetes_asyncio", "kubernetes_asyncio.client"
# The only dunders the two __init__s define: any other one is a probe (the import system,
# introspection) that must not run them.
_DEFINED_DUNDERS = frozenset({"__version__", "__project__", "__all__"})


class _Deferred(types.ModuleType):
    """A package whose `__init__` has not run yet; it runs at the first name it lacks that
    is not one of its submodules (`from kubernetes_asyncio.client import rest` inside the
    library imports the submodule, as it would without us, before any __init__ of ours)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name not in _DEFINED_DUNDERS:
            raise AttributeError(name)
        if importlib.util.find_spec(f"{self.__name__}.{name}") is not None:
            return importlib.import_module(f"{self.__name__}.{name}")
        _complete(self)
        return getattr(self, name)


def _complete(module: types.ModuleType) -> None:
    """Run the package's own `__init__` in it; a plain module from then on."""
    module.__class__ = types.ModuleType
    spec = module.__spec__
    assert spec is not None and spec.loader is not None
    code = spec.loader.get_code(spec.name)  # type: ignore[attr-defined]
    exec(code, module.__dict__)  # noqa: S102 - the library's own __init__, as `import` would run it


def _deferred(name: str) -> types.ModuleType:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations is not None
    module = _Deferred(name)
    module.__spec__, module.__loader__ = spec, spec.loader
    module.__path__ = list(spec.submodule_search_locations)
    module.__file__, module.__package__ = spec.origin, name
    sys.modules[name] = module
    return module


def _api_client(*args: Any, **kwargs: Any) -> Any:
    """`client.ApiClient` for kube_config's `new_client_from_config`, which we never call."""
    return importlib.import_module(f"{_CLIENT}.api_client").ApiClient(*args, **kwargs)


if _ROOT not in sys.modules:
    _root, _client = _deferred(_ROOT), _deferred(_CLIENT)
    _root.client = _client  # type: ignore[attr-defined]
    _client.Configuration = importlib.import_module(f"{_CLIENT}.configuration").Configuration  # type: ignore[attr-defined]
    _client.ApiClient = _api_client  # type: ignore[attr-defined]

from kubernetes_asyncio.client.configuration import Configuration  # noqa: E402
from kubernetes_asyncio.config.config_exception import ConfigException  # noqa: E402
from kubernetes_asyncio.config.incluster_config import (  # noqa: E402
    SERVICE_CERT_FILENAME,
    SERVICE_TOKEN_FILENAME,
    load_incluster_config,
)
from kubernetes_asyncio.config.kube_config import load_kube_config  # noqa: E402
