"""Benchmark (issue 34 item 2): a replica's CPU per watch event against the event's size.

Every replica watches every VMI, so one tenant patching a fat VMI costs each of them what reading its events
costs. The path measured is a replica's own: the stream in 512-byte chunks (what a slow connection delivers),
cut into lines (`kube.watch.lines`), decoded, and applied to the view; the peer is the same with requests'
`iter_lines`, which the watch used before (it joins and splits again all that is pending at every chunk).
Each size is a labelled VMI whose devices annotation stays as it is while another annotation carries the bulk,
as a tenant patching it would send. Prints CPU ms per event for each beside the other, the ratio, and CPU ms
per MiB (flat when the cost is linear in the size). In memory, no API server; asserts nothing.
Run: `make bench` (or `python bench/events.py`).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable, Iterator

import requests

from cozygpu.api import kinds
from cozygpu.api.names import ANNOTATION_DEVICES, LABEL_DEVICE_REFERENCE, TRUE
from cozygpu.kube.watch import lines
from cozygpu.runtime.view import View
from cozygpu.state.cluster import Cluster

KIB = 1024
SIZES = (16 * KIB, 256 * KIB, 1024 * KIB, 1350 * KIB)  # 1.35 MiB: what the issue measured, near etcd's limit


def stream(size: int, count: int) -> bytes:
    """`count` MODIFIED events of one VMI of about `size` bytes each, as a watch writes them."""
    out = []
    for version in range(1, count + 1):
        meta = {
            "name": "fat",
            "namespace": "tenant",
            "uid": "u1",
            "resourceVersion": str(version),
            "labels": {LABEL_DEVICE_REFERENCE: TRUE},
            "annotations": {ANNOTATION_DEVICES: json.dumps([{"device": "d"}]), "bulk": f"{version}" + "x" * size},
        }
        out.append(json.dumps({"type": "MODIFIED", "object": {"metadata": meta, "status": {"phase": "Running"}}}))
    return ("\n".join(out) + "\n").encode()


def chunks(data: bytes, size: int = 512) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def with_lines(data: bytes) -> Iterator[bytes]:
    return lines(chunks(data))


def with_iter_lines(data: bytes) -> Iterator[bytes]:
    response = requests.models.Response()
    response.raw = io.BytesIO(data)
    yield from response.iter_lines(chunk_size=512)


def cpu_per_event(read: Callable[[bytes], Iterator[bytes]], data: bytes, count: int) -> float:
    """CPU ms per event: the lines read, decoded and applied to a fresh view."""
    view = View(Cluster())
    started = time.process_time()
    for line in read(data):
        if line.strip():
            view.apply(kinds.VMI, json.loads(line)["object"])
    return (time.process_time() - started) * 1000 / count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=5, help="events per size")
    args = p.parse_args()
    head = "CPU per VMI event (ms), 512-byte chunks"
    print(f"{head:<44}{'lines':>10}{'iter_lines':>12}{'ratio':>8}{'lines ms/MiB':>14}")
    for size in SIZES:
        data = stream(size, args.events)
        ours = cpu_per_event(with_lines, data, args.events)
        before = cpu_per_event(with_iter_lines, data, args.events)
        per_mib = ours / (len(data) / args.events / (1024 * KIB))
        print(f"{f'{size // KIB} KiB':<44}{ours:>10.2f}{before:>12.2f}{before / ours:>8.1f}{per_mib:>14.2f}")


if __name__ == "__main__":
    main()
