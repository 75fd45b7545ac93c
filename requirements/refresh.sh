#!/usr/bin/env bash
# Regenerate the hash-pinned locks from pyproject.toml:
#   requirements/runtime.lock  [project] dependencies + [build-system] requires (setuptools),
#                              what the image and a user's install need;
#   requirements/test.lock     the same plus the `test` extra, what .ci/run and a developer's
#                              venv install.
# Every file of every pinned release is listed by sha256, so `pip install --require-hashes`
# refuses anything else: a new upstream release changes nothing until this script is run
# and its diff committed (a PyYAML release once turned a fresh clone's CI red).
#
#   requirements/refresh.sh                        keep the current pins, add what pyproject
#                                                  now needs (after editing dependencies)
#   requirements/refresh.sh --upgrade              move every pin to the newest allowed release
#   requirements/refresh.sh --upgrade-package X    move one
#
# The resolver is uv (a pinned release, installed from PyPI into .cache/ on first use):
# `uv pip compile` reads pyproject.toml's dependencies and extras directly, resolves for a
# target Python and platform other than the one running it, and writes hashes for every
# wheel and sdist of a pin in one pass. The target is CPython 3.11 on x86_64 manylinux: the
# CI machine and the image (Dockerfile, python:3.11-slim). --only-binary: every pin must
# have a wheel, so installing never builds a dependency (a build would fetch its own
# unpinned build backend).
set -euo pipefail
cd "$(dirname "$0")/.."

uv_version=0.13.8
tool=.cache/uv-$uv_version
if [ ! -x "$tool/bin/uv" ]; then
  python3 -m venv "$tool"
  "$tool/bin/python" -m pip install --quiet "uv==$uv_version"
fi

# pyproject.toml is the one place the build backend's requirement is written.
build_requires=$(python3 -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))')

compile() {
  local out=$1
  shift
  printf '%s\n' "$build_requires" | "$tool/bin/uv" pip compile --quiet pyproject.toml - \
    --generate-hashes --only-binary :all: \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --custom-compile-command requirements/refresh.sh \
    --output-file "$out" "$@"
}

compile requirements/test.lock --extra test "$@"
# The runtime lock takes its versions from the test lock: the two never disagree on a pin.
compile requirements/runtime.lock --constraint requirements/test.lock
echo "requirements/refresh.sh: wrote requirements/test.lock and requirements/runtime.lock" >&2
