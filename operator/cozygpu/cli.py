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
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Literal, get_args, get_origin

import structlog
from pydantic import ValidationError

from cozygpu import __version__, logs
from cozygpu.api import crdgen
from cozygpu.devcluster import identity
from cozygpu.runtime.process import handlers
from cozygpu.settings import ENV_PREFIX, Settings

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


def settings_of(args: argparse.Namespace, environ: Mapping[str, str], kubeconfig: str | None) -> Settings:
    """`run`'s settings: its flags (unset: None) over `environ`'s COZYGPU_ variables over the defaults."""
    overrides = {name: getattr(args, name, None) for name in Settings.model_fields}
    overrides["kubeconfig"] = kubeconfig
    if args.dev or args.no_webhooks:
        overrides["webhook_mode"] = "dev" if args.dev else "off"
    if args.exempt_namespace:
        overrides["exempt_namespaces"] = tuple(args.exempt_namespace)
    return Settings.load(environ, overrides)


def _run(args: argparse.Namespace) -> int:
    kubeconfig = args.kubeconfig
    if (args.dev or args.webhook_mode == "dev") and kubeconfig and not args.as_given:
        # §12.4: never as a person's credentials, or the webhooks that skip the operator would skip them too.
        own, user = identity.own_identity(Path(kubeconfig), Path(tempfile.mkdtemp(prefix="cozygpu-dev-")))
        if own != Path(kubeconfig):
            said = f"{user} installed the operator's ServiceAccount {identity.USERNAME} with the chart's RBAC"
            print(
                f"cozygpu run --dev: {said}; the operator runs as it, so {user} meets every rule of §9", file=sys.stderr
            )
        kubeconfig = str(own)
    try:
        settings = settings_of(args, os.environ, kubeconfig)
    except ValidationError as e:
        print(f"cozygpu run: invalid settings:\n{e}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    asyncio.run(handlers.run(settings))
    return 0


# Settings a flag of `run` does not set: the main parser's (logging, before the command), the list the flag
# `--exempt-namespace` builds, and the tests' own, which are kept out of --help.
_NOT_RUN_FLAGS = frozenset({"log_format", "log_level", "exempt_namespaces"})
_HIDDEN = frozenset({"crash_at_write", "watch_timeout"})


def _setting_flags(run: argparse.ArgumentParser) -> None:
    """A flag per setting (settings.Settings is their one source): its name, type, description, default and
    environment variable; a boolean gets --name and --no-name. Unset flags leave the environment's value."""
    for name, field in Settings.model_fields.items():
        if name in _NOT_RUN_FLAGS:
            continue
        default = "unset" if field.default is None else field.default
        said = f"{field.description or name.replace('_', ' ')} (default {default}; {ENV_PREFIX}{name.upper()})"
        options: dict[str, Any] = {"help": argparse.SUPPRESS if name in _HIDDEN else said, "default": None}
        kind = field.annotation
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif get_origin(kind) is Literal:
            options["choices"] = get_args(kind)
        else:
            types = [t for t in (get_args(kind) or (kind,)) if t is not type(None)]
            options["type"] = types[0] if types and types[0] in (int, float) else str
        run.add_argument("--" + name.replace("_", "-"), **options)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cozygpu", description="GPUs for KubeVirt virtual machines.")
    # The bare version, so the image's build and tests compare it with the chart's appVersion.
    p.add_argument("--version", action="version", version=__version__)
    p.add_argument("--log-format", choices=["json", "console"], default=None)
    p.add_argument("--log-level", default=None)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator")
    _setting_flags(run)
    run.add_argument(
        "--exempt-namespace",
        action="append",
        metavar="NAMESPACE",
        help="a namespace §12 does not guard, by name; repeat for more (COZYGPU_EXEMPT_NAMESPACES, comma-separated)",
    )
    run.add_argument(
        "--dev",
        action="store_true",
        help="self-signed webhook certificate; register (and on exit remove) the webhook configurations (the same as "
        "--webhook-mode dev)",
    )
    run.add_argument(
        "--as-given",
        action="store_true",
        help="with --dev: run as the kubeconfig's own user, not as the operator's ServiceAccount (tests that "
        "restrict what the operator may do)",
    )
    run.add_argument("--no-webhooks", action="store_true", help="run without admission webhooks (--webhook-mode off)")
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
