"""A fake kubelet and virt-handler for the dev control plane (§11.1): no containers, no VMs.

What a node agent would do, reduced to the status KubeVirt's controllers read:
a pod bound to a node turns Running with every container started; a pod being
deleted is removed (the kubelet's final delete); a VMI that virt-controller marked
Scheduled turns Running, written as virt-handler's ServiceAccount on the VMI's node
(virt-api drops VMI status changes from anyone else, and refuses virt-handler's for
VMIs on other nodes). It polls, which is plenty for a test cluster.
Started and stopped by `devcluster.kubevirt.KubeVirt`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from typing import Any

import structlog

from cozygpu.api import kinds
from cozygpu.api.meta import now
from cozygpu.kube.adapter import ApiError, Body, Kube, NotFound

log = structlog.get_logger("cozygpu.devcluster")

TERMINAL = ("Succeeded", "Failed")


def _stamp() -> str:
    return now().isoformat().replace("+00:00", "Z")


def running_status(pod: Body) -> Body:
    """The status a kubelet reports once every container of the pod has started."""
    at = _stamp()
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": at}},
        }
        for c in pod.get("spec", {}).get("containers", [])
    ]
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": at}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    return {"status": {"phase": "Running", "startTime": at, "conditions": conditions, "containerStatuses": statuses}}


# virt-api lets virt-handler write only VMIs on the node its token names (KubeVirt's NodeRestriction).
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


class FakeKubelet:
    def __init__(self, kube: Kube, handler_user: str, interval: float = 0.1) -> None:
        """`kube` acts on pods (an administrator) and impersonates `handler_user` on each node for VMI writes."""
        self._kube = kube
        self._handler_user = handler_user
        self._handlers: dict[str, Kube] = {}
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self.started_pods: list[str] = []  # namespace/name of every pod it ran, in order

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sync()
            except ApiError as e:  # the API server restarting, a race with a controller: next pass
                log.debug("fake_kubelet.retry", error=e.message)
            except OSError as e:
                log.debug("fake_kubelet.retry", error=str(e))

    def sync(self) -> None:
        """One pass over pods and VMIs."""
        for pod in self._kube.list(kinds.POD):
            self._pod(pod)
        for vmi in self._kube.list(kinds.VMI):
            self._vmi(vmi)

    def _handler(self, node: str) -> Kube:
        """virt-handler as it runs on `node`: its ServiceAccount, its node in the token's extra info."""
        if node not in self._handlers:
            self._handlers[node] = self._kube.impersonating(self._handler_user, {NODE_NAME_EXTRA: node})
        return self._handlers[node]

    def _pod(self, pod: Body) -> None:
        meta, spec = pod["metadata"], pod.get("spec", {})
        name, namespace = meta["name"], meta["namespace"]
        if meta.get("deletionTimestamp"):
            # The kubelet's last word on a pod that was asked to stop.
            self._kube.delete(kinds.POD, name, namespace, uid=meta["uid"], grace_seconds=0)
            return
        phase = pod.get("status", {}).get("phase")
        if spec.get("nodeName") and phase not in ("Running", *TERMINAL):
            with contextlib.suppress(NotFound):
                self._kube.patch(kinds.POD, name, running_status(pod), namespace, subresource="status")
                self.started_pods.append(f"{namespace}/{name}")

    def _vmi(self, vmi: Body) -> None:
        meta, status = vmi["metadata"], vmi.get("status", {})
        if meta.get("deletionTimestamp") or status.get("phase") != "Scheduled" or not status.get("nodeName"):
            return
        # As virt-handler: the phase with its transition time, which KubeVirt's VM controller reads to tell a
        # VMI that ran (a restart) from one that failed to start (its start-failure backoff).
        at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        times = [*(status.get("phaseTransitionTimestamps") or []), {"phase": "Running", "phaseTransitionTimestamp": at}]
        patch: dict[str, Any] = {"status": {"phase": "Running", "phaseTransitionTimestamps": times}}
        with contextlib.suppress(NotFound):
            self._handler(status["nodeName"]).patch(kinds.VMI, meta["name"], patch, meta["namespace"])
