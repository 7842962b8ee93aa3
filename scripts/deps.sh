#!/usr/bin/env bash
# Installs the Debian packages exl3.cpp builds and tests with (as root; skips what is already installed).
set -euo pipefail
pkgs=(cmake ninja-build g++ clang pkg-config googletest libgtest-dev libbenchmark-dev nlohmann-json3-dev libfmt-dev
      libcli11-dev libpcre2-dev libcpp-httplib-dev pybind11-dev python3-dev)
# Headless Chromium runs the chat page's test (tests/server/page_test.mjs, driven by playwright-core from npm).
pkgs+=(chromium)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node and npm run the server tests (tests/server); they may come from outside Debian (NodeSource ships npm inside
# its nodejs package), so they are looked for as commands, not packages.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${missing[*]} (run as root or install them)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
