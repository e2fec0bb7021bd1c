"""The watch's echo of our own writes (issue 22 item 4): the writer puts each write's answer into the view at
once, so the watch event of that very version brings nothing new and is not parsed again; any other version,
and every deletion, still goes in (§6.4)."""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu.api import GPUDevice, kinds
from cozygpu.runtime.view import View
from cozygpu.runtime.watching.informer import Informer
from cozygpu.state.cluster import Change, Cluster
from tests.support.memkube import MemKube
from tests.support.writing import NS, device, with_status

Body = dict[str, Any]


def _setup(monkeypatch: pytest.MonkeyPatch) -> tuple[Informer, View, MemKube, list[str], list[Change]]:
    kube, view = MemKube(), View(Cluster())
    parsed: list[str] = []
    real = GPUDevice.from_wire

    def counting(body: Body) -> GPUDevice:
        parsed.append(str(body["metadata"].get("resourceVersion")))
        return real(body)

    monkeypatch.setattr(GPUDevice, "from_wire", staticmethod(counting))
    heard: list[Change] = []
    view.subscribe(heard.append, kinds.GPU_DEVICE)
    return Informer(view, kube, kinds.GPU_DEVICE, timeout=240), view, kube, parsed, heard


def test_the_echo_of_a_version_the_view_holds_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    informer, view, kube, parsed, heard = _setup(monkeypatch)
    written = kube.put(kinds.GPU_DEVICE, device("d1"))
    view.apply(kinds.GPU_DEVICE, written)  # the writer's answer
    assert len(parsed) == 1 and len(heard) == 1
    informer._take(written)  # the watch's event of the same version
    assert len(parsed) == 1 and len(heard) == 1


def test_a_newer_version_and_a_deletion_still_go_in(monkeypatch: pytest.MonkeyPatch) -> None:
    informer, view, kube, parsed, heard = _setup(monkeypatch)
    written = kube.put(kinds.GPU_DEVICE, device("d1"))
    view.apply(kinds.GPU_DEVICE, written)
    assert len(parsed) == 1
    newer = kube.change(kinds.GPU_DEVICE, with_status(written, phase="Bound", nodeName="n1"), status=True)
    informer._take(newer)
    held = view.cluster.devices.get((NS, "d1"))
    assert held is not None and held.status.node_name == "n1" and len(heard) == 2 and len(parsed) == 2
    informer._take(newer, deleted=True)
    assert view.cluster.devices.get((NS, "d1")) is None
