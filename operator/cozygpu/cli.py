"""The `cozygpu` console script.

Subcommands:
  dev-cluster  run a local control plane (etcd, kube-apiserver, our CRDs and
               KubeVirt's) in the foreground and write an admin kubeconfig
  crds         write the CRDs generated from the models to crds/ (or --check them)
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import structlog

from cozygpu import logs
from cozygpu.api import crdgen
from cozygpu.devcluster.controlplane import ControlPlane


def _crds(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if args.check:
        stale = [
            name
            for name, text in crdgen.rendered().items()
            if not (directory / name).exists() or (directory / name).read_text() != text
        ]
        if stale:
            print(f"CRDs in {directory} differ from the models: {', '.join(stale)}; run `make crds`")
            return 1
        return 0
    for path in crdgen.write(directory):
        print(path)
    return 0


def _dev_cluster(args: argparse.Namespace) -> int:
    log = structlog.get_logger()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    plane = ControlPlane(verbose=args.verbose)
    try:
        plane.start()
        path = plane.write_kubeconfig(Path(args.kubeconfig).expanduser().resolve())
        print(f"dev-cluster ready: {plane.server} kubeconfig={path} data={plane.workdir} (Ctrl-C stops it)", flush=True)
        while not stop.wait(1.0):
            pass
    except Exception as e:
        log.error("dev_cluster.failed", error=str(e))
        return 1
    finally:
        plane.stop()
        log.info("dev_cluster.stopped")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cozygpu", description="GPUs for KubeVirt virtual machines.")
    p.add_argument("--log-format", choices=["json", "console"], default="console")
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev-cluster", help="run a local control plane in the foreground")
    dev.add_argument("--kubeconfig", required=True, help="where to write the admin kubeconfig")
    dev.add_argument("--verbose", action="store_true", help="verbose kube-apiserver logs")
    dev.set_defaults(func=_dev_cluster)

    crds = sub.add_parser("crds", help="write (or --check) the CRDs generated from the models")
    crds.add_argument("--dir", default="crds")
    crds.add_argument("--check", action="store_true")
    crds.set_defaults(func=_crds)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure(args.log_format, args.log_level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
