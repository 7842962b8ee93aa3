#!/usr/bin/env bash
# One command on a fresh Debian machine: install dependencies, build, and generate text with the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
./build/release/tools/exl3/exl3 run -m tests/models/tiny-draft -p "Once upon a time" -n 64 --temperature 0
