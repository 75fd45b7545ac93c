# Sourced by the Go builds of the test tools (tests/cluster/build.sh: the control plane;
# tests/tools/build-helm.sh; tests/tools/build-kueue.sh): what they share, written once.
# The sourcing script sets `build_name` (its path, for messages) first and defines
# `up_to_date` (its stamp check) before calling `wait_turn`.

die() {
	echo "$build_name: ERROR: $*" >&2
	exit 1
}

# require_go WHAT: Go >= 1.26 on PATH, used as is (GOTOOLCHAIN=local: every go.mod here says
# go 1.26.0, and no other toolchain is fetched behind our back), CGO off as the projects'
# release builds (no C toolchain needed). Sets `go_version`.
require_go() {
	command -v go >/dev/null 2>&1 || die "go not found in PATH (Go >= 1.26 is required to build $1)"
	export GOTOOLCHAIN=local
	export CGO_ENABLED=0
	go_version=$(go env GOVERSION) || die "'go env GOVERSION' failed"
	[[ $go_version =~ ^go([0-9]+)\.([0-9]+) ]] || die "cannot parse Go version '$go_version'"
	if ((BASH_REMATCH[1] < 1 || (BASH_REMATCH[1] == 1 && BASH_REMATCH[2] < 26))); then
		die "Go >= 1.26 required ($1 declares go 1.26.0), found $go_version"
	fi
}

# wait_turn OUT_DIR LOCK_NAME: exits 0 when `up_to_date`, before or after waiting for a
# concurrent build (two pytest sessions, the CI step and a fixture) to finish, so the same
# cores never compile one thing twice.
wait_turn() {
	if up_to_date; then
		exit 0
	fi
	mkdir -p "$1"
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$1/$2.lock"
		flock 9
		if up_to_date; then
			exit 0
		fi
	fi
}

# require_space KIB DIR...: refuse to start a cold build that would fill a disk halfway.
require_space() {
	local need_kib=$1 d probe avail
	shift
	for d in "$@"; do
		probe=$d
		while [[ ! -d $probe ]]; do probe=$(dirname "$probe"); done
		avail=$(df -Pk "$probe" | awk 'NR==2 {print $4}')
		if ((avail < need_kib)); then
			die "only $((avail / 1024)) MiB free under $d; a cold build needs about $((need_kib / 1024)) MiB"
		fi
	done
}
