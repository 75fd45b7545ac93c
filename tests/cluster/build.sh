#!/usr/bin/env bash
# Build the minik8s control-plane binary (tests/cluster) into <repo>/.cache/minik8s.
#
# A no-op (well under a second) when the binary is up to date: the stamp is a
# hash of go.mod, go.sum, *.go, this script and the Go version. GOCACHE and
# GOMODCACHE stay at their defaults ($HOME/.cache/go-build, $HOME/go/pkg/mod)
# so repeated runs and CI jobs reuse them; a cold build compiles most of
# k8s.io/kubernetes and takes several minutes on two cores.
#
# Exits non-zero, loudly, on any failure: the e2e tests must fail (not skip)
# when the control plane cannot be built.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out_dir="$root/.cache"
bin="$out_dir/minik8s"
stamp_file="$out_dir/minik8s.stamp"

build_name=tests/cluster/build.sh
# shellcheck source=../tools/gobuild.sh
source "$root/tests/tools/gobuild.sh"
require_go "the test control plane (k8s.io/kubernetes 1.37)"

cd "$here"
stamp=$(
	{
		echo "$go_version"
		sha256sum go.mod go.sum build.sh ./*.go
	} | sha256sum | cut -d' ' -f1
)
up_to_date() { [[ -x $bin && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; }
wait_turn "$out_dir" minik8s
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
echo "tests/cluster/build.sh: building minik8s ($kube_version, $go_version) -> $bin" >&2
start=$SECONDS
if ! go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp" .; then
	die "go build failed (see the compiler output above)"
fi
"$tmp" version >/dev/null || die "the freshly built binary does not run"
mv -f "$tmp" "$bin"
echo "$stamp" >"$stamp_file"
echo "tests/cluster/build.sh: built $bin in $((SECONDS - start))s ($(du -h "$bin" | cut -f1))" >&2
