#!/usr/bin/env bash
# Builds the control plane binaries the tests and dev-cluster run (§11): etcd and
# kube-apiserver, optionally kube-scheduler, kube-controller-manager and kubectl,
# from the Go module proxy at pinned versions, into a cache directory.
#
# Usage: hack/build-control-plane.sh [extra binary ...]
#   extra binaries: kube-scheduler kube-controller-manager kubectl helm
#   (helm, for the chart's tests, is built from helm.sh/helm/v4 in a module of its own)
# Prints the directory holding the binaries on its last line (use it as
# KUBEBUILDER_ASSETS). When KUBEBUILDER_ASSETS already holds etcd and
# kube-apiserver, nothing is built and that directory is printed.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
CACHE_ROOT="${COZYGPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cozy-gpu-operator}"
OUT="$CACHE_ROOT/control-plane/$K8S_VERSION"
SRC="$CACHE_ROOT/control-plane/src-$K8S_VERSION"

wanted=(etcd kube-apiserver "$@")

have_all() {
  local dir=$1; shift
  for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && have_all "$KUBEBUILDER_ASSETS" "${wanted[@]}"; then
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi
if have_all "$OUT" "${wanted[@]}"; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-control-plane: Go is needed to build the control plane" >&2; exit 1; }
mkdir -p "$OUT" "$SRC"
export GOFLAGS="-mod=mod"
export CGO_ENABLED=0

# helm has its own module: its k8s.io requirements must not move the control plane's.
build_helm() {
  local src="$CACHE_ROOT/helm/src-$HELM_VERSION" start
  start=$(date +%s)
  mkdir -p "$src"
  printf 'module cozygpu.local/helm\n\ngo 1.26.0\n\nrequire helm.sh/helm/v4 %s\n\ntool helm.sh/helm/v4/cmd/helm\n' \
    "$HELM_VERSION" > "$src/go.mod"
  echo "build-control-plane: building helm $HELM_VERSION" >&2
  (cd "$src" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$OUT/helm.tmp" helm.sh/helm/v4/cmd/helm >&2)
  mv "$OUT/helm.tmp" "$OUT/helm"
  echo "build-control-plane: built helm in $(( $(date +%s) - start ))s" >&2
}

kube_wanted=()
for b in "${wanted[@]}"; do
  if [ "$b" = helm ]; then
    [ -x "$OUT/helm" ] || build_helm
  elif [ ! -x "$OUT/$b" ]; then
    kube_wanted+=("$b")
  fi
done
if [ ${#kube_wanted[@]} -eq 0 ]; then
  echo "$OUT"
  exit 0
fi
cd "$SRC"

# k8s.io/kubernetes points its staging modules at ./staging; a consumer module must
# replace each with its published v0.x twin. Read the list from the module itself so
# a version bump needs no edit here.
minor=${K8S_VERSION#v1.}
staging_version="v0.$minor"
gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[ -f "$gomod" ] || { echo "build-control-plane: could not fetch k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
etcd_version=$(sed -n 's#^\s*go.etcd.io/etcd/server/v3 \(v[^ ]*\).*#\1#p' "$gomod" | head -n1)

{
  echo "module cozygpu.local/control-plane"
  echo
  echo "go 1.26.0"
  echo
  echo "require ("
  echo "	k8s.io/kubernetes $K8S_VERSION"
  echo "	go.etcd.io/etcd/server/v3 $etcd_version"
  echo ")"
  echo
  echo "replace ("
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
  echo ")"
  echo
  echo "tool ("
  echo "	go.etcd.io/etcd/server/v3"
  echo "	k8s.io/kubernetes/cmd/kube-apiserver"
  echo "	k8s.io/kubernetes/cmd/kube-scheduler"
  echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
  echo "	k8s.io/kubernetes/cmd/kubectl"
  echo ")"
} > go.mod
echo "build-control-plane: resolving modules for kubernetes $K8S_VERSION, etcd $etcd_version" >&2
go mod tidy >&2

pkg_of() {
  case $1 in
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    *) echo "k8s.io/kubernetes/cmd/$1" ;;
  esac
}

# Without a stamped version /version reports v0.0.0-master, which clients distrust.
major=1
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=${minor%%.*}"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

for b in "${kube_wanted[@]}"; do
  start=$(date +%s)
  echo "build-control-plane: building $b" >&2
  go build -trimpath -ldflags "$ldflags" -o "$OUT/$b.tmp" "$(pkg_of "$b")" >&2
  mv "$OUT/$b.tmp" "$OUT/$b"
  echo "build-control-plane: built $b in $(( $(date +%s) - start ))s" >&2
done
echo "$OUT"
