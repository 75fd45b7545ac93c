#!/usr/bin/env bash
# Build a binary of the tests/cluster Go module (k8s.io/kubernetes at the release go.mod pins):
#   tests/cluster/build.sh            the minik8s control plane (./*.go) into <repo>/.cache/minik8s
#   tests/cluster/build.sh kubectl    k8s.io/kubernetes's own cmd/kubectl into <repo>/.cache/kubectl/kubectl
#
# kubectl is the one of the API server the e2e tests talk to (tests/e2e/kubectl.py; go.mod
# names it with a `tool` directive, which keeps its packages in go.sum). A binary of its
# own rather than a `minik8s kubectl` subcommand: the control plane's binary and stamp do
# not depend on it, and kubectl's own packages (kustomize, cli-runtime, the printers) are
# compiled only for it; built after the control plane, most of what it needs (client-go,
# apimachinery, the API types) is already in the Go build cache.
#
# A no-op (well under a second) when the binary is up to date: the stamp is a
# hash of go.mod, go.sum, this script, gobuild.sh, the Go version and, for minik8s,
# *.go. GOCACHE and GOMODCACHE stay at their defaults ($HOME/.cache/go-build,
# $HOME/go/pkg/mod) so repeated runs and CI jobs reuse them; a cold build of minik8s
# compiles most of k8s.io/kubernetes and takes several minutes on two cores.
#
# Exits non-zero, loudly, on any failure: the e2e tests must fail (not skip)
# when the control plane cannot be built.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${1:-minik8s}
cd "$here"
case $target in
minik8s) out_dir="$root/.cache" package=. sources=(./*.go) ;;
kubectl) out_dir="$root/.cache/kubectl" package=k8s.io/kubernetes/cmd/kubectl sources=() ;;
*)
	echo "usage: tests/cluster/build.sh [minik8s|kubectl]" >&2
	exit 2
	;;
esac
bin="$out_dir/$target"
stamp_file="$out_dir/$target.stamp"

build_name="tests/cluster/build.sh $target"
# shellcheck source=../tools/gobuild.sh
source "$root/tests/tools/gobuild.sh"
require_go "$target (k8s.io/kubernetes 1.37)"

stamp=$(
	{
		echo "$go_version"
		sha256sum go.mod go.sum build.sh ../tools/gobuild.sh "${sources[@]}"
	} | sha256sum | cut -d' ' -f1
)
up_to_date() { [[ -x $bin && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; }
wait_turn "$out_dir" "$target"
# A cold build needs ~1 GiB of modules and ~2-3 GiB of build cache, plus the binary.
require_space $((5 * 1024 * 1024)) "$(go env GOMODCACHE)" "$(go env GOCACHE)" "$out_dir"

# /version must report the pinned Kubernetes release instead of the
# "v0.0.0-master+$Format:%H$" placeholder (k8s.io/component-base/version/base.go);
# client-go carries its own copy (k8s.io/client-go/pkg/version/base.go).
kube_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' go.mod)
[[ $kube_version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+ ]] || die "cannot find the k8s.io/kubernetes version in go.mod"
kmajor=${BASH_REMATCH[1]} kminor=${BASH_REMATCH[2]}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$kmajor -X $pkg.gitMinor=$kminor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

tmp="$bin.tmp.$$"
trap 'rm -f "$tmp"' EXIT
echo "$build_name: building $target ($kube_version, $go_version) -> $bin" >&2
start=$SECONDS
if ! go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp" "$package"; then
	die "go build failed (see the compiler output above)"
fi
if [[ $target == kubectl ]]; then
	version=$("$tmp" version --client -o json) || die "the freshly built kubectl does not run"
	[[ $version == *"\"gitVersion\": \"$kube_version\""* ]] || die "the built kubectl reports $version"
else
	"$tmp" version >/dev/null || die "the freshly built binary does not run"
fi
mv -f "$tmp" "$bin"
echo "$stamp" >"$stamp_file"
echo "$build_name: built $bin in $((SECONDS - start))s ($(du -h "$bin" | cut -f1))" >&2
