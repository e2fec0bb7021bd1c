#!/usr/bin/env bash
# Builds the operator's image (hack/Dockerfile) with whatever builder is present, first found wins:
#   docker   when its engine answers (`docker info`); a CLI without an engine is passed over
#   buildah  (RUN steps with --isolation chroot, which works where no OCI runtime can)
#   podman
# COZYGPU_IMAGE_BUILDER=docker|buildah|podman picks one.
#
# The base: python:3.11-slim where a registry serves it; otherwise a Debian base made with
# mmdebstrap (python3, python3-venv, ca-certificates), cached as a tarball under
# $CACHE/image-base/ keyed by suite and package list. COZYGPU_IMAGE_BASE names another base.
#
# The image is tagged $IMAGE (default the chart's: ghcr.io/cozystack/cozy-gpu-operator:<version>)
# and labelled with a hash of what goes into it; a second run with the same hash builds nothing
# (COZYGPU_IMAGE_REBUILD=1 builds anyway). Prints the image reference on its last line; exits 3,
# saying why on stderr, when no builder (or base) can be had, so callers can skip rather than fail.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
CACHE_ROOT="${COZYGPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozy-gpu-operator}"
REGISTRY_BASE="${COZYGPU_REGISTRY_BASE:-docker.io/library/python:3.11-slim}"
SUITE="${COZYGPU_IMAGE_SUITE:-bookworm}"  # bookworm's python3 is 3.11, the project's floor
PACKAGES="python3,python3-venv,ca-certificates"

say() { echo "build-image: $*" >&2; }
unavailable() { say "$*"; exit 3; }

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n1)"
[ -n "$version" ] || { say "no version in pyproject.toml"; exit 1; }
IMAGE="${IMAGE:-ghcr.io/cozystack/cozy-gpu-operator:$version}"

# -- the builder ---------------------------------------------------------------------------------
usable() {
  case "$1" in
    docker) command -v docker >/dev/null && docker info >/dev/null 2>&1 ;;
    buildah) command -v buildah >/dev/null && buildah info >/dev/null 2>&1 ;;
    podman) command -v podman >/dev/null && podman info >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}
if [ -n "${COZYGPU_IMAGE_BUILDER:-}" ]; then
  builder="$COZYGPU_IMAGE_BUILDER"
  command -v "$builder" >/dev/null || unavailable "COZYGPU_IMAGE_BUILDER=$builder is not installed (Debian: apt-get install buildah mmdebstrap)"
  usable "$builder" || unavailable "COZYGPU_IMAGE_BUILDER=$builder does not work here: \`$builder info\` fails"
else
  builder=""
  for b in docker buildah podman; do
    if usable "$b"; then builder=$b; break; fi
  done
  if [ -z "$builder" ]; then
    why="no image builder: docker without a running engine, buildah and podman absent"
    command -v docker >/dev/null || why="no image builder: none of docker, buildah, podman is installed"
    unavailable "$why (Debian: apt-get install buildah mmdebstrap)"
  fi
fi

label_of() {  # label_of IMAGE KEY: the label's value, empty when the image or label is missing
  case "$builder" in
    buildah) buildah inspect --type image --format "{{ index .OCIv1.Config.Labels \"$2\" }}" "$1" 2>/dev/null || true ;;
    *) "$builder" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true ;;
  esac
}
image_id() {
  case "$builder" in
    buildah) buildah inspect --type image --format '{{ .FromImageID }}' "$1" 2>/dev/null || true ;;
    *) "$builder" image inspect --format '{{ .Id }}' "$1" 2>/dev/null || true ;;
  esac
}
has_image() {
  case "$builder" in
    docker) docker image inspect "$1" >/dev/null 2>&1 ;;
    *) "$builder" inspect --type image "$1" >/dev/null 2>&1 ;;
  esac
}

# -- the base ------------------------------------------------------------------------------------
debian_base() {
  command -v mmdebstrap >/dev/null || unavailable "no registry serves $REGISTRY_BASE and mmdebstrap is not installed"
  local key tarball ref
  key="$(printf '%s %s minbase nodocs' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)"
  ref="localhost/cozy-gpu-operator-base:$SUITE-$key"
  if has_image "$ref"; then echo "$ref"; return; fi
  tarball="$CACHE_ROOT/image-base/$SUITE-$key.tar"
  [ -d "$tarball" ] && rm -rf "$tarball"  # an older script left a directory here
  if [ ! -f "$tarball" ] || [ ! -s "$tarball" ]; then
    mkdir -p "$(dirname "$tarball")"
    say "making a $SUITE base with mmdebstrap ($PACKAGES) into $tarball"
    # No docs, man pages or locales: an operator reads none of them.
    # --format: the output's name does not end in .tar, and mmdebstrap would make a directory of it.
    mmdebstrap --variant=minbase --format=tar --include="$PACKAGES" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      "$SUITE" "$tarball.tmp" >&2 || { rm -rf "$tarball.tmp"; unavailable "mmdebstrap could not make a $SUITE base"; }
    mv "$tarball.tmp" "$tarball"
  fi
  case "$builder" in
    docker) docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$tarball" "$ref" >/dev/null ;;
    podman) podman import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$tarball" "$ref" >/dev/null ;;
    buildah)
      local c
      c="$(buildah from scratch)"
      buildah add --quiet "$c" "$tarball" / >/dev/null
      buildah config --env PATH=/usr/local/bin:/usr/bin:/bin "$c"
      buildah commit --quiet --rm "$c" "$ref" >/dev/null
      ;;
  esac
  echo "$ref"
}

pull() {
  case "$builder" in
    docker) timeout 120 docker pull --quiet "$1" >/dev/null 2>&1 ;;
    *) timeout 120 "$builder" pull --quiet "$1" >/dev/null 2>&1 ;;
  esac
}

if [ -n "${COZYGPU_IMAGE_BASE:-}" ]; then
  base="$COZYGPU_IMAGE_BASE"
elif has_image "$REGISTRY_BASE" || pull "$REGISTRY_BASE"; then
  base="$REGISTRY_BASE"
else
  say "no registry serves $REGISTRY_BASE: a Debian $SUITE base from mmdebstrap instead"
  base="$(debian_base)"
fi

# -- the context: only what the Dockerfile copies, so the hash is of what goes in ----------------
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
cp "$root/pyproject.toml" "$root/README.md" "$here/Dockerfile" "$context/"
tar -C "$root" --exclude='__pycache__' --exclude='*.egg-info' --exclude='*.pyc' -cf - operator | tar -C "$context" -xf -
hash="$( { echo "$base"; cd "$context" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } \
  | sha256sum | cut -c1-16)"

if [ "${COZYGPU_IMAGE_REBUILD:-0}" != 1 ] && [ "$(label_of "$IMAGE" io.cozystack.gpu.source-hash)" = "$hash" ]; then
  say "$IMAGE is up to date (source hash $hash)"
  echo "$IMAGE"
  exit 0
fi

previous="$(image_id "$IMAGE")"
say "building $IMAGE with $builder from $base"
start=$(date +%s)
args=(-f "$context/Dockerfile" --build-arg "BASE=$base" --build-arg "VERSION=$version"
      --label "io.cozystack.gpu.source-hash=$hash" -t "$IMAGE")
# pip inside the build trusts what pip here trusts (a proxy's CA, say), through a secret mount.
ca="${PIP_CERT:-${SSL_CERT_FILE:-${REQUESTS_CA_BUNDLE:-}}}"
if [ -n "$ca" ] && [ -s "$ca" ]; then args+=(--secret "id=pip-ca,src=$ca"); fi
case "$builder" in
  docker) docker build "${args[@]}" "$context" >&2 ;;
  # chroot: no OCI runtime needed for RUN steps; never pull: the base is local or was just pulled.
  buildah) buildah bud --isolation chroot --pull=never --layers=false "${args[@]}" "$context" >&2 ;;
  podman) podman build --pull=never "${args[@]}" "$context" >&2 ;;
esac
say "built $IMAGE in $(( $(date +%s) - start ))s"
# The image this one replaced, untagged now: removed, or every rebuild would leave one behind.
if [ -n "$previous" ] && [ "$previous" != "$(image_id "$IMAGE")" ]; then "$builder" rmi "$previous" >/dev/null 2>&1 || true; fi
echo "$IMAGE"
