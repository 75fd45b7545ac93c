"""kube.loaders: the kubeconfig loaders without kubernetes_asyncio's generated API,
and the whole library still there for whoever asks for it (in a fresh interpreter each).
"""

from __future__ import annotations

import json
import subprocess
import sys


def run(code: str) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded: dict[str, object] = json.loads(result.stdout.splitlines()[-1])
    return loaded


COUNT = "sum(m.startswith('kubernetes_asyncio') for m in sys.modules)"


def test_the_client_loads_no_generated_api_until_asked() -> None:
    seen = run(f"""
import sys, json
import kube.api
before = {COUNT}
models = 'kubernetes_asyncio.client.models' in sys.modules
import kubernetes_asyncio.client as client
from kubernetes_asyncio import config, watch
import kubernetes_asyncio
print(json.dumps({{"before": before, "models": models, "api": client.CoreV1Api.__name__,
                  "api_client": client.ApiClient.__module__, "version": kubernetes_asyncio.__version__,
                  "same": client.Configuration is kube.api.Configuration, "watch": watch.Watch.__name__,
                  "after": {COUNT}}}))
""")
    assert not seen["models"] and isinstance(seen["before"], int) and seen["before"] < 30
    assert (seen["api"], seen["api_client"], seen["same"], seen["watch"]) == (
        "CoreV1Api", "kubernetes_asyncio.client.api_client", True, "Watch")
    assert seen["version"] and isinstance(seen["after"], int) and seen["after"] > 500


def test_a_library_imported_first_is_used_as_it_is() -> None:
    seen = run("""
import sys, json
import kubernetes_asyncio.client as first
import kube.api
print(json.dumps({"same": kube.api.Configuration is first.Configuration,
                  "plain": type(sys.modules["kubernetes_asyncio.client"]).__name__}))
""")
    assert seen == {"same": True, "plain": "module"}
