"""Where the operator's clients find the API server: a kubeconfig, or in a pod the kubelet's variables."""

from __future__ import annotations

from cozygpu.kube import credentials


def test_in_cluster_server_is_the_kubelets_service_address() -> None:
    """KUBERNETES_SERVICE_HOST and _PORT make the URL both clients dial; IPv6 hosts are bracketed."""
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert credentials.in_cluster_server(env) == "https://10.96.0.1:443"
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert credentials.in_cluster_server(env) == "https://[fd00::1]:6443"


def test_outside_a_pod_there_is_no_in_cluster_server() -> None:
    """Without the kubelet's variables (or with one missing) nothing overrides kopf's own default."""
    assert credentials.in_cluster_server({}) is None
    assert credentials.in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None
