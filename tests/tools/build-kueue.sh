#!/usr/bin/env bash
# Build Kueue's controller-manager from the Go module proxy into <repo>/.cache/kueue/ (never
# committed), with the module's CRDs and webhook manifests copied beside it.
#
# The Kueue tests (tests/e2e/kueue.py) run this real Kueue out of cluster against the test
# control plane (tests/cluster), so what Kueue does with a Workload (quota reservation,
# AdmissionChecks, unsuspending the Job) is Kueue's own behaviour, not a mock.
#
# Why sigs.k8s.io/kueue v0.19.2: the newest release the module proxy serves here (v0.19.x
# is the line whose DRA integration, deviceClassMappings, is beta and on by default); it
# declares go 1.26.0 and builds against k8s.io/* v0.36 (a second copy beside tests/cluster's
# v0.37: module zips leave vendor/ out, so those compile cold once, then GOCACHE holds them).
#
# Built from the module's own go.mod and go.sum (see below why not `go install m@v`), with
# GOMODCACHE and GOCACHE at their defaults so repeated runs and CI jobs reuse them, as for
# the control plane and helm. ldflags as Kueue's Makefile (-X sigs.k8s.io/kueue/pkg/version.*), plus
# -s -w; CGO off as its release image.
#
# A no-op when the stamp (this script's hash and the Go version) matches and the outputs
# exist. Exits non-zero, loudly, on any failure: the Kueue tests fail (never skip) when
# Kueue cannot be built.
set -euo pipefail

KUEUE_MODULE=sigs.k8s.io/kueue
KUEUE_VERSION=v0.19.2
KUEUE_COMMIT=8eab68778fc1b52affe165fdf5af29d1e9b4f3cb # the tag's commit (the proxy's .info Origin)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out_dir="$root/.cache/kueue"
bin="$out_dir/kueue"
stamp_file="$out_dir/kueue.stamp"

build_name=tests/tools/build-kueue.sh
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"
require_go "Kueue $KUEUE_VERSION ($KUEUE_MODULE)"

# The script's content, not its path (sha256sum FILE prints the path): every clone agrees.
stamp=$({ echo "$go_version"; sha256sum <"$here/build-kueue.sh"; } | sha256sum | cut -d' ' -f1)
up_to_date() {
	[[ -x $bin && -d $out_dir/crd && -f $out_dir/webhooks.yaml && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]
}
wait_turn "$out_dir" kueue

# A cold build needs ~0.6 GiB of modules and ~2 GiB of build cache, plus the binary.
require_space $((3 * 1024 * 1024)) "$(go env GOMODCACHE)" "$(go env GOCACHE)" "$out_dir"

tmp_dir=$(mktemp -d "$out_dir/build.XXXXXX")
trap 'rm -rf "$tmp_dir"' EXIT
echo "tests/tools/build-kueue.sh: building Kueue ($KUEUE_MODULE@$KUEUE_VERSION, $go_version) -> $bin" >&2
start=$SECONDS
version_pkg=$KUEUE_MODULE/pkg/version
# Not `go install module@version`: it also asks the proxy for the module's version list (to
# report deprecation), which this proxy refuses (403) for Kueue, failing the install. So the
# exact release is fetched (`go mod download`, checked against the checksum database) and
# built in its own module directory in GOMODCACHE, in module mode from its own go.mod and
# go.sum (-mod=readonly: nothing is resolved anew; Kueue has no replace directives).
# GOFLAGS from the environment (e.g. -mod=vendor) must not leak into Kueue's build.
src=$(GOFLAGS= go mod download -json "$KUEUE_MODULE@$KUEUE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p') ||
	die "go mod download $KUEUE_MODULE@$KUEUE_VERSION failed"
[[ -n $src && -f $src/go.mod && -d $src/config/components/crd/bases ]] || die "cannot find $KUEUE_MODULE@$KUEUE_VERSION in GOMODCACHE"
if ! GOFLAGS= go build -C "$src" -mod=readonly -trimpath \
	-ldflags "-s -w -X $version_pkg.GitVersion=$KUEUE_VERSION -X $version_pkg.GitCommit=$KUEUE_COMMIT -X $version_pkg.BuildDate=1970-01-01T00:00:00Z" \
	-o "$tmp_dir/kueue" ./cmd/kueue; then
	die "go build of $KUEUE_MODULE@$KUEUE_VERSION ./cmd/kueue failed (see the compiler output above)"
fi
"$tmp_dir/kueue" --help >/dev/null 2>&1 || die "the freshly built kueue does not run"

# The CRDs and webhook configurations of exactly the built release (GOMODCACHE is
# read-only; copied so the tests need no go).
mkdir "$tmp_dir/crd"
cp "$src"/config/components/crd/bases/*.yaml "$tmp_dir/crd/"
cp "$src/config/components/webhook/manifests.yaml" "$tmp_dir/webhooks.yaml"
chmod -R u+w "$tmp_dir"

rm -rf "$out_dir/crd"
mv "$tmp_dir/crd" "$out_dir/crd"
mv -f "$tmp_dir/webhooks.yaml" "$out_dir/webhooks.yaml"
mv -f "$tmp_dir/kueue" "$bin"
echo "$stamp" >"$stamp_file"
echo "tests/tools/build-kueue.sh: built $bin in $((SECONDS - start))s ($(du -h "$bin" | cut -f1))" >&2
