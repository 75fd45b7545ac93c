#!/usr/bin/env bash
# Prometheus and promtool for the tests (alert unit tests, the dashboard/alert e2e test),
# from Debian's `prometheus` package (bookworm: 2.42). Idempotent: does nothing when both
# binaries already answer. Fails, clearly, when they are missing and apt cannot install
# them: the tests that need them fail rather than skip, so CI must not go on without them.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  echo "prometheus: $(prometheus --version 2>&1 | head -1)"
  exit 0
fi

if ! command -v apt-get >/dev/null; then
  echo "prometheus/promtool are not installed and apt-get is not available: install Debian's" \
       "'prometheus' package (or put prometheus and promtool >= 2.42 on PATH) and rerun" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "prometheus/promtool are not installed, and installing Debian's 'prometheus' package" \
         "needs root (no sudo here): install it and rerun" >&2
    exit 1
  fi
  sudo=(sudo -n)
fi

started=$(date +%s)
# The package's postinst would start a service where an init system runs; in containers
# policy-rc.d normally forbids that. Recommends (node exporter, ...) are not needed.
if ! apt-cache show prometheus >/dev/null 2>&1; then
  "${sudo[@]}" apt-get update -qq
fi
if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null; then
  echo "apt-get install prometheus failed: prometheus/promtool are needed by the tests" >&2
  exit 1
fi
for tool in prometheus promtool; do
  command -v "$tool" >/dev/null || { echo "$tool still missing after installing the 'prometheus' package" >&2; exit 1; }
done
echo "prometheus: $(prometheus --version 2>&1 | head -1) (installed in $(( $(date +%s) - started ))s)"
