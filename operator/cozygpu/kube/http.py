"""pykube's HTTP client as the adapter uses it: a pool sized to the callers, the environment read once.

Callers: `kube.adapter` (`Kube.from_kubeconfig`, `Kube.in_cluster`, `Kube.impersonating`).
"""

from __future__ import annotations

import pykube
import pykube.http
import requests


def client(config: pykube.KubeConfig, timeout: float, connections: int) -> pykube.HTTPClient:
    """pykube's client keeping up to `connections` connections open: one per concurrent caller, reused
    (requests' default of 10 would open and close a TLS connection for every call past the tenth)."""
    adapter = pykube.http.KubernetesHTTPAdapter(config, pool_connections=1, pool_maxsize=connections)
    return settled(pykube.HTTPClient(config, timeout=timeout, http_adapter=adapter))


def settled(api: pykube.HTTPClient) -> pykube.HTTPClient:
    """The environment's proxies read once, not on every call: requests otherwise looks for a .netrc and
    re-reads the proxy variables per request, a tenth of the operator's CPU under load (§13)."""
    api.session.proxies = requests.utils.get_environ_proxies(api.url)
    api.session.trust_env = False
    return api
