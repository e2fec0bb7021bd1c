#!/usr/bin/env bash
# Builds KubeVirt's control plane for the tests (§11.1): virt-controller, virt-api and
# kv-dump (the source copy's generator of what virt-operator would install: CRDs, RBAC,
# webhook configurations), from a KubeVirt source tree, into a cache directory.
#
# Where the source comes from, first found wins:
#   KUBEVIRT_SRC       a checkout, or the extraction of the tarball
#   ../shared/kubevirt/kubevirt-src-*.tar.xz beside the checkout (the design material)
#   a clone of the pinned commit, where the network allows
# KUBEVIRT_ASSETS pointing at a directory with the three binaries skips the build.
# Prints the directory holding the binaries on its last line; exits 3 (after saying
# why on stderr) when no source can be had, so callers can skip rather than fail.
set -euo pipefail

KUBEVIRT_COMMIT="${KUBEVIRT_COMMIT:-d923fdb815cd2016ddaebdaaa51db04133576d72}"
KUBEVIRT_REPO="${KUBEVIRT_REPO:-https://github.com/kubevirt/kubevirt.git}"
CACHE_ROOT="${COZYGPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozy-gpu-operator}"
here="$(cd "$(dirname "$0")" && pwd)"
wanted=(virt-controller virt-api kv-dump)

have_all() {
  for b in "${wanted[@]}"; do [ -x "$1/$b" ] || return 1; done
}

if [ -n "${KUBEVIRT_ASSETS:-}" ]; then
  have_all "$KUBEVIRT_ASSETS" || { echo "build-kubevirt: KUBEVIRT_ASSETS=$KUBEVIRT_ASSETS lacks ${wanted[*]}" >&2; exit 3; }
  echo "$KUBEVIRT_ASSETS"
  exit 0
fi

# The cache is keyed by the source: the pinned commit, or a checkout's own HEAD.
src="${KUBEVIRT_SRC:-}"
key="$KUBEVIRT_COMMIT"
if [ -n "$src" ]; then
  [ -d "$src/cmd/virt-controller" ] || { echo "build-kubevirt: KUBEVIRT_SRC=$src is not a KubeVirt source tree" >&2; exit 3; }
  key="$(git -C "$src" rev-parse HEAD 2>/dev/null || echo "src-$(echo "$src" | sha256sum | cut -c1-12)")"
fi
OUT="$CACHE_ROOT/kubevirt/$key"
if have_all "$OUT"; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-kubevirt: Go is needed to build KubeVirt" >&2; exit 3; }
if [ -z "$src" ]; then
  src="$CACHE_ROOT/kubevirt/src-${KUBEVIRT_COMMIT:0:10}"
  if [ ! -d "$src/cmd/virt-controller" ]; then
    tarball="$(ls "$here"/../../shared/kubevirt/kubevirt-src-"${KUBEVIRT_COMMIT:0:10}"*.tar.xz 2>/dev/null | head -n1 || true)"
    rm -rf "$src.tmp" && mkdir -p "$src.tmp"
    if [ -n "$tarball" ]; then
      echo "build-kubevirt: extracting $tarball" >&2
      tar -xJf "$tarball" -C "$src.tmp"
    elif git clone --quiet --filter=blob:none "$KUBEVIRT_REPO" "$src.tmp" >&2 2>/dev/null \
        && git -C "$src.tmp" checkout --quiet "$KUBEVIRT_COMMIT" >&2; then
      echo "build-kubevirt: cloned $KUBEVIRT_REPO at $KUBEVIRT_COMMIT" >&2
      if [ ! -d "$src.tmp/tools/kv-dump" ]; then
        # kv-dump is not KubeVirt's own: it ships with the tarball of the design material.
        echo "build-kubevirt: the clone has no tools/kv-dump; use the tarball (KUBEVIRT_SRC)" >&2
        exit 3
      fi
    else
      rm -rf "$src.tmp"
      echo "build-kubevirt: no KubeVirt source: set KUBEVIRT_SRC, or put kubevirt-src-${KUBEVIRT_COMMIT:0:10}.tar.xz" \
        "in ../shared/kubevirt/, or allow a clone of $KUBEVIRT_REPO" >&2
      exit 3
    fi
    rm -rf "$src" && mv "$src.tmp" "$src"
  fi
fi

mkdir -p "$OUT"
# KubeVirt vendors its dependencies: nothing is fetched, and no cgo is needed for these three.
export CGO_ENABLED=0 GOFLAGS=-mod=vendor
for b in "${wanted[@]}"; do
  [ -x "$OUT/$b" ] && continue
  start=$(date +%s)
  pkg="./cmd/$b"
  [ "$b" = kv-dump ] && pkg=./tools/kv-dump
  echo "build-kubevirt: building $b" >&2
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$OUT/$b.tmp" "$pkg" >&2)
  mv "$OUT/$b.tmp" "$OUT/$b"
  echo "build-kubevirt: built $b in $(( $(date +%s) - start ))s" >&2
done
echo "$OUT"
