"""The `cozygpu` console script.

Subcommands:
  run          run the operator: webhooks, binder, node accountant
  dev-cluster  run a local control plane (etcd, kube-apiserver, our CRDs and
               KubeVirt's; with --kubevirt KubeVirt's controllers too) in the
               foreground and write an admin kubeconfig
  crds         write the CRDs generated from the models to crds/ and the chart's crds/
               (or --check both)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

import structlog
from pydantic import ValidationError

from cozygpu import __version__, logs
from cozygpu.api import crdgen
from cozygpu.devcluster import identity
from cozygpu.runtime.process import handlers
from cozygpu.settings import Settings

# Where `cozygpu crds` writes (relative to the checkout, where make runs it): the CRDs for `kubectl apply`, and the
# chart's copy, which `helm install` creates (issue 23 item 1). Both are the same text.
CRD_DIRS = ("crds", "charts/cozy-gpu-operator/crds")


def _crds(args: argparse.Namespace) -> int:
    rendered = crdgen.rendered()
    directories = [Path(d) for d in args.dir or CRD_DIRS]
    if args.check:
        drift = []
        for directory in directories:
            stale = [
                n for n, text in rendered.items() if not (directory / n).exists() or (directory / n).read_text() != text
            ]
            extra = sorted(p.name for p in directory.glob("*.yaml") if p.name not in rendered)
            if stale or extra:
                drift.append(f"{directory}: " + ", ".join([*stale, *(f"{n} (not generated)" for n in extra)]))
        for line in drift:
            print(f"CRDs differ from the models in {line}; run `make crds`")
        return 1 if drift else 0
    for directory in directories:
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
    # Imported here: `run` in production never starts a control plane, and should not load its tooling.
    from cozygpu.devcluster.controlplane import ControlPlane  # noqa: PLC0415 (loaded only for dev-cluster)

    plane = ControlPlane(verbose=args.verbose, kubevirt=args.kubevirt)
    try:
        plane.start(timeout=180 if args.kubevirt else 120)
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


def _run(args: argparse.Namespace) -> int:
    kubeconfig = args.kubeconfig
    if args.dev and kubeconfig and not args.as_given:
        # §12.4: never as a person's credentials, or the webhooks that skip the operator would skip them too.
        own, user = identity.own_identity(Path(kubeconfig), Path(tempfile.mkdtemp(prefix="cozygpu-dev-")))
        if own != Path(kubeconfig):
            said = f"{user} installed the operator's ServiceAccount {identity.USERNAME} with the chart's RBAC"
            print(
                f"cozygpu run --dev: {said}; the operator runs as it, so {user} meets every rule of §9", file=sys.stderr
            )
        kubeconfig = str(own)
    overrides = {
        "kubeconfig": kubeconfig,
        "bind_timeout": args.bind_timeout,
        "webhook_timeout": args.webhook_timeout,
        "drain_seconds": args.drain_seconds,
        "grace_period": args.grace_period,
        "sweep_interval": args.sweep_interval,
        "pod_scan_interval": args.pod_scan_interval,
        "max_devices_per_vmi": args.max_devices_per_vmi,
        "max_admissions_per_namespace": args.max_admissions_per_namespace,
        "max_idle_moves": args.max_idle_moves,
        "idle_move_after": args.idle_move_after,
        "budgets_required": True if args.budgets_required else None,
        "crash_at_write": args.crash_at_write,
        "watch_timeout": args.watch_timeout,
        "health_host": args.health_host,
        "health_port": args.health_port,
        "metrics_auth": False if args.no_metrics_auth else None,
        "webhook_mode": "dev" if args.dev else ("off" if args.no_webhooks else None),
        "webhook_port": args.webhook_port,
        "binder": False if args.no_binder else None,
        "webhook_cert_dir": args.webhook_cert_dir,
        "webhook_client_ca": args.webhook_client_ca,
        "leader_election": False if args.no_leader_election else None,
        "identity": args.identity,
        "lease_name": args.lease_name,
        "lease_namespace": args.lease_namespace,
        "lease_duration": args.lease_duration,
        "kubevirt_controller_user": args.kubevirt_controller_user,
        "exempt_namespaces": tuple(args.exempt_namespace) if args.exempt_namespace else None,
        "api_concurrency": args.api_concurrency,
        "log_format": args.log_format,
        "log_level": args.log_level,
    }
    try:
        settings = Settings.load(os.environ, overrides)
    except ValidationError as e:
        print(f"cozygpu run: invalid settings:\n{e}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    asyncio.run(handlers.run(settings))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cozygpu", description="GPUs for KubeVirt virtual machines.")
    # The bare version, so the image's build and tests compare it with the chart's appVersion.
    p.add_argument("--version", action="version", version=__version__)
    p.add_argument("--log-format", choices=["json", "console"], default=None)
    p.add_argument("--log-level", default=None)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument("--kubeconfig", help="unset: the in-cluster service account")
    run.add_argument("--bind-timeout", type=float, help="seconds the webhook waits for the binder (default 10)")
    run.add_argument("--webhook-timeout", type=float, help="the API server's webhook timeout (default 20)")
    run.add_argument(
        "--drain-seconds", type=float, help="on SIGTERM, answer admissions this long before stopping (default 3)"
    )
    run.add_argument("--grace-period", type=float, help="attachment grace period, seconds (default 120)")
    run.add_argument("--sweep-interval", type=float, help="safety-net sweep period, seconds (default 60)")
    run.add_argument("--crash-at-write", type=int, help=argparse.SUPPRESS)  # tests/reliability only
    run.add_argument("--watch-timeout", type=int, help=argparse.SUPPRESS)  # COZYGPU_WATCH_TIMEOUT; tests shorten it
    run.add_argument(
        "--max-devices-per-vmi", type=int, help="device references a VMI may list (default 64); more are refused"
    )
    run.add_argument(
        "--budgets-required",
        action="store_true",
        help="refuse GPU orders in a namespace no GPUBudget covers (COZYGPU_BUDGETS_REQUIRED)",
    )
    run.add_argument(
        "--exempt-namespace",
        action="append",
        metavar="NAMESPACE",
        help="a namespace §12 does not guard, by name; repeat for more (COZYGPU_EXEMPT_NAMESPACES, comma-separated)",
    )
    run.add_argument(
        "--max-admissions-per-namespace",
        type=int,
        help="VMI admissions one namespace may have under way at once (default 128); more are refused",
    )
    run.add_argument(
        "--max-idle-moves",
        type=int,
        help="idle held devices one placement may move to make room for an order (default 4; 0: never, §5.7)",
    )
    run.add_argument(
        "--idle-move-after",
        type=float,
        help="seconds a held device must have been idle before it may move for someone else (default 120, §5.7)",
    )
    run.add_argument(
        "--pod-scan-interval", type=float, help="period of the list of every pod on a node, seconds (default 300)"
    )
    run.add_argument("--health-host", help="address of /healthz and /readyz (default 0.0.0.0)")
    run.add_argument("--health-port", type=int, help="port of /healthz and /readyz (default 8080)")
    run.add_argument(
        "--no-metrics-auth",
        action="store_true",
        help="serve /metrics to anyone who reaches the port (COZYGPU_METRICS_AUTH=false); by default only to "
        "callers allowed get on /metrics",
    )
    run.add_argument(
        "--dev",
        action="store_true",
        help="self-signed webhook certificate; register (and on exit remove) the webhook configurations",
    )
    run.add_argument(
        "--as-given",
        action="store_true",
        help="with --dev: run as the kubeconfig's own user, not as the operator's ServiceAccount (tests that "
        "restrict what the operator may do)",
    )
    run.add_argument("--no-webhooks", action="store_true", help="run without admission webhooks")
    run.add_argument("--no-binder", action="store_true", help="run without the binder (nothing answers bind requests)")
    run.add_argument("--webhook-port", type=int, help="webhook port (default 9443; 0 or unset with --dev: any free)")
    run.add_argument("--webhook-cert-dir", help="directory with tls.crt and tls.key (default /etc/cozygpu/tls)")
    run.add_argument(
        "--webhook-client-ca",
        help="PEM CAs whose client certificates may call the webhooks, as the API server presents one; unset: "
        "any caller (with --dev: the dev control plane's, when it publishes one)",
    )
    run.add_argument("--no-leader-election", action="store_true", help="decide without holding the Lease")
    run.add_argument("--identity", help="this replica in the Lease (default: the host name, a pod's name)")
    run.add_argument("--lease-name", help="the Lease replicas compete for (default cozy-gpu-operator)")
    run.add_argument("--lease-namespace", help="its namespace (default: the service account's or kubeconfig's)")
    run.add_argument("--lease-duration", type=float, help="a leader's term in seconds (default 15)")
    run.add_argument(
        "--api-concurrency", type=int, help="API calls in flight at once, and connections kept open (default 32)"
    )
    run.add_argument(
        "--kubevirt-controller-user",
        help="KubeVirt's controller identity, the only creator of launcher pods with GPUs "
        "(default system:serviceaccount:kubevirt:kubevirt-controller)",
    )
    run.set_defaults(func=_run)

    dev = sub.add_parser("dev-cluster", help="run a local control plane in the foreground")
    dev.add_argument("--kubeconfig", required=True, help="where to write the admin kubeconfig")
    dev.add_argument("--verbose", action="store_true", help="verbose kube-apiserver logs")
    dev.add_argument(
        "--kubevirt",
        action="store_true",
        help="KubeVirt in the loop: kube-scheduler, virt-api, virt-controller and a fake kubelet (§11.1)",
    )
    dev.set_defaults(func=_dev_cluster)

    crds = sub.add_parser("crds", help="write (or --check) the CRDs generated from the models")
    crds.add_argument(
        "--dir", action="append", help=f"a directory to write or check; repeatable (default: {', '.join(CRD_DIRS)})"
    )
    crds.add_argument("--check", action="store_true")
    crds.set_defaults(func=_crds)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure(args.log_format or "console", args.log_level or "INFO")
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
