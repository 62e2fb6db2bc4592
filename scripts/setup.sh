#!/usr/bin/env bash
# Installs the Debian packages VeloxQuant builds with, skipping those already present.
# `--fuzz` adds what scripts/fuzz.sh needs. Idempotent; needs root (or sudo) only when
# something is missing.
set -euo pipefail

packages=(g++ make cmake git libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
          nlohmann-json3-dev libfmt-dev libpcre2-dev libicu-dev pkg-config)
# The Python bindings and their tests (issue 12), and pkg-config for the installed-package test.
packages+=(python3-dev python3-pybind11 pybind11-dev python3-numpy python3-pytest pkg-config)
# `veloxquant serve` (issues 22, 32): Boost.Beast + Boost.Asio for HTTP (header-only);
# chromium for the chat page's browser test.
packages+=(libboost-dev chromium)
# The replica test (issue 32): three servers behind HAProxy (deploy/haproxy.cfg).
packages+=(haproxy)
# scripts/fuzz.sh (`setup.sh --fuzz`) also needs clang with its libFuzzer and sanitizer runtimes.
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-dev llvm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "setup: missing packages (${missing[*]}) and not root; install them or run as root" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi
