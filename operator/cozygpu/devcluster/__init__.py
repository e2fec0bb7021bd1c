"""A local control plane for tests, the demo and benchmarks (§11).

`controlplane` starts etcd and kube-apiserver on loopback with our CRDs and
KubeVirt's installed; `nodes` creates fake GPU nodes through the API. Used by the
pytest fixtures, `cozygpu dev-cluster`, the demo and `bench/`.
"""
