#!/usr/bin/env bash
# Build helm from the Go module proxy into <repo>/.cache/helm/helm (never committed).
#
# The chart tests (tests/unit/test_chart.py, tests/e2e/test_chart.py) render and lint
# deploy/helm/dra-quota with this real helm; like the control plane (tests/cluster/build.sh)
# it is built from source with the machine's Go, nothing is downloaded but modules.
#
# Why helm v4 (v4.3.1) and not v3.22.0: v4 is the maintained major (v3 gets security fixes
# only), the chart (apiVersion v2) installs with either, and v4.3.1 builds against
# k8s.io/client-go v0.37.1, the release our control plane runs: `helm template` reports
# Kubernetes 1.37 as .Capabilities.KubeVersion (helm derives it from the client-go module
# version in the build info, helm.sh/helm/v4 internal/version), and the k8s.io modules it
# shares with tests/cluster are the same versions in GOMODCACHE.
#
# `go install module@version` builds in module mode from helm's own go.mod and go.sum
# (checked against the checksum database), with GOMODCACHE and GOCACHE at their defaults
# so repeated runs and CI jobs reuse them, as for the control plane. ldflags as helm's
# Makefile (`-s -w -X .../internal/version.version=...`), CGO off as its release builds.
#
# A no-op when the stamp (this script's hash and the Go version) matches and the binary
# exists. Exits non-zero, loudly, on any failure: the chart tests fail (never skip) when
# helm cannot be built.
set -euo pipefail

HELM_MODULE=helm.sh/helm/v4
HELM_VERSION=v4.3.1

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out_dir="$root/.cache/helm"
bin="$out_dir/helm"
stamp_file="$out_dir/helm.stamp"

build_name=tests/tools/build-helm.sh
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"
require_go "helm $HELM_VERSION ($HELM_MODULE)"

# The script's content, not its path (sha256sum FILE prints the path): every clone agrees.
stamp=$({ echo "$go_version"; sha256sum <"$here/build-helm.sh"; } | sha256sum | cut -d' ' -f1)
up_to_date() { [[ -x $bin && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]]; }
wait_turn "$out_dir" helm

tmp_dir=$(mktemp -d "$out_dir/build.XXXXXX")
trap 'rm -rf "$tmp_dir"' EXIT
echo "tests/tools/build-helm.sh: building helm ($HELM_MODULE@$HELM_VERSION, $go_version) -> $bin" >&2
start=$SECONDS
# GOFLAGS from the environment (e.g. -mod=vendor) must not leak into helm's build.
if ! GOFLAGS= GOBIN="$tmp_dir" go install -trimpath \
	-ldflags "-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION -X $HELM_MODULE/internal/version.gitTreeState=clean" \
	"$HELM_MODULE/cmd/helm@$HELM_VERSION"; then
	die "go install $HELM_MODULE/cmd/helm@$HELM_VERSION failed (see the compiler output above)"
fi
version=$("$tmp_dir/helm" version --template '{{.Version}}') || die "the freshly built helm does not run"
[[ $version == "$HELM_VERSION" ]] || die "built helm reports version '$version', expected $HELM_VERSION"
mv -f "$tmp_dir/helm" "$bin"
echo "$stamp" >"$stamp_file"
echo "tests/tools/build-helm.sh: built $bin in $((SECONDS - start))s ($(du -h "$bin" | cut -f1))" >&2
