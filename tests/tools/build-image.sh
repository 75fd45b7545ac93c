#!/usr/bin/env bash
# Build the Dockerfile for real with buildah (Debian's package: no daemon, rootful here,
# vfs storage, chroot isolation) and smoke-test the image: `dra-quota --version` and
# `dra-quota serve --help` run inside it as the chart runs it (user 65532). Prints the
# image's size. Not part of .ci/run: 2 minutes with a base at hand, 8 1/2 cold with the
# stand-in base below (load average 10 on 2 cores), and about 0.7 GB under .cache/image.
#
#   bash tests/tools/build-image.sh             # tag localhost/dra-quota:dev
#
# Everything it writes stays in <repo>/.cache/image (buildah's --root/--runroot, the
# stand-in base's rootfs), never /var/lib/containers.
#
# The base: the Dockerfile's pinned python:3.11-slim, pulled when a registry serves it.
# Where none is reachable (this project's machines reach package registries only), a
# stand-in is built from Debian's packages with debootstrap: bookworm's python3 (3.11,
# the version the tests run on) and python3-pip, passed as PYTHON_IMAGE; the image is
# then the same Dockerfile on another base, and the size printed is on that base.
#
# The machine's CA bundle and a pip.conf naming it are mounted into the build's RUN
# steps (never into a layer), so pip reaches PyPI through a TLS-inspecting proxy too.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
state="$root/.cache/image"
tag=localhost/dra-quota:dev
standin=localhost/python-bookworm:3.11
die() {
	echo "tests/tools/build-image.sh: ERROR: $*" >&2
	exit 1
}
say() { echo "tests/tools/build-image.sh: $*" >&2; }

install_debian_package() { # COMMAND PACKAGE
	command -v "$1" >/dev/null && return
	[[ $(id -u) == 0 ]] && command -v apt-get >/dev/null || die "$1 is missing: install Debian's '$2' package"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null || die "apt-get install $2 failed"
}
install_debian_package buildah buildah
mkdir -p "$state"
buildah=(buildah --root "$state/storage" --runroot "$state/run" --storage-driver vfs)
start=$SECONDS

base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$root/Dockerfile")
build_args=()
# name@digest: containers/image refuses a reference with both a tag and a digest.
if "${buildah[@]}" pull -q "docker.io/library/${base%%:*}@${base#*@}" >/dev/null 2>"$state/pull.log"; then
	say "base: $base (pulled)"
else
	say "cannot pull $base ($(tail -1 "$state/pull.log")); building a stand-in base from Debian's packages"
	if ! "${buildah[@]}" inspect --type image "$standin" >/dev/null 2>&1; then
		install_debian_package debootstrap debootstrap
		rm -rf "$state/rootfs"
		debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm \
			"$state/rootfs" http://deb.debian.org/debian >"$state/debootstrap.log" 2>&1 ||
			die "debootstrap failed: see $state/debootstrap.log"
		# As python:3.11-slim: pip installs into the system Python (no PEP 668 marker), and
		# no apt lists or docs.
		rm -rf "$state"/rootfs/usr/lib/python3.*/EXTERNALLY-MANAGED "$state"/rootfs/var/lib/apt/lists/* \
			"$state"/rootfs/var/cache/apt/* "$state"/rootfs/usr/share/doc/* "$state"/rootfs/usr/share/man/*
		ctr=$("${buildah[@]}" from scratch)
		mnt=$("${buildah[@]}" mount "$ctr")
		cp -a "$state/rootfs/." "$mnt/"
		"${buildah[@]}" umount "$ctr" >/dev/null
		"${buildah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			--env LANG=C.UTF-8 --cmd python3 "$ctr"
		"${buildah[@]}" commit -q "$ctr" "$standin" >/dev/null
		"${buildah[@]}" rm "$ctr" >/dev/null
	fi
	build_args=(--build-arg "PYTHON_IMAGE=$standin")
	base=$standin
	say "base: $base (bookworm's python3, a stand-in for the pinned python:3.11-slim)"
fi

volumes=()
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
	printf '[global]\ncert = /run/build-ca/ca-certificates.crt\n' >"$state/pip.conf"
	volumes=(--volume /etc/ssl/certs/ca-certificates.crt:/run/build-ca/ca-certificates.crt:ro
		--volume "$state/pip.conf:/etc/pip.conf:ro")
fi
say "building $tag (log: $state/build.log)"
"${buildah[@]}" bud --isolation chroot --layers=false "${volumes[@]}" "${build_args[@]}" -t "$tag" "$root" \
	>"$state/build.log" 2>&1 || die "buildah bud failed: $(tail -3 "$state/build.log")"

ctr=$("${buildah[@]}" from "$tag")
trap '"${buildah[@]}" rm "$ctr" >/dev/null' EXIT
run() { "${buildah[@]}" run --isolation chroot --user 65532:65532 "$ctr" -- "$@"; }
version=$(run dra-quota --version) || die "dra-quota --version failed in the image"
say "dra-quota --version: $version"
run dra-quota serve --help >"$state/serve-help.txt" || die "dra-quota serve --help failed in the image"
say "dra-quota serve --help: $(head -1 "$state/serve-help.txt") ... ($(wc -l <"$state/serve-help.txt") lines)"
size() { "${buildah[@]}" images --format '{{.Size}}' "$1"; }
say "image $tag: $(size "$tag") (base $base: $(size "$base")); user $("${buildah[@]}" inspect --type image \
	--format '{{.OCIv1.Config.User}}, entrypoint {{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.Cmd}}' "$tag")"
say "done in $((SECONDS - start))s"
