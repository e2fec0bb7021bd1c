"""The order ledger's size against the API server's own limit (§7.4, §14): why held orders stop at HELD_BYTES."""

from __future__ import annotations

import pytest

from cozygpu.api import kinds
from cozygpu.kube.adapter import ApiError, Kube
from cozygpu.runtime.ledger import CONFIG_MAP, HELD_MAX

pytestmark = pytest.mark.integration


def _config_map(name: str, namespace: str, size: int) -> dict[str, object]:
    chunk = 64 * 1024
    data = {f"k{i:04d}": "x" * min(chunk, size - i * chunk) for i in range((size + chunk - 1) // chunk)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def test_the_api_server_refuses_a_ledger_past_1_mib(kube: Kube, namespace: str) -> None:
    """A ConfigMap whose data passes 1 MiB is refused, so a ledger that grew past it would fail every tenant's
    orders; held orders stop at HELD_MAX, which leaves a quarter of what is taken to the binder's template orders."""
    assert HELD_MAX <= 3 * 1024 * 1024 // 4
    kube.create(CONFIG_MAP, _config_map("fits", namespace, 1024 * 1024 - 4096))
    with pytest.raises(ApiError) as refused:
        kube.create(CONFIG_MAP, _config_map("too-big", namespace, 1024 * 1024 + 1))
    assert refused.value.status in (413, 422), refused.value.message
    assert kube.get_or_none(kinds.kind("ConfigMap"), "too-big", namespace) is None
