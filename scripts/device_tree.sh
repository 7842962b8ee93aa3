#!/usr/bin/env bash
# Moves the large committed test data (golden models, tiny-draft, fixtures: ~68 MB) out of the checkout before a
# device call, so that the tree plus what the call carries fits the device tool's 64 MiB, and back after it.
# The device scripts remake what they need (device_all_tests.sh regenerates the golden models there).
# Usage: bash scripts/device_tree.sh out [PATH...]  (before the call; default all three, e.g. `out
#        tests/models/golden` for device_all_tests.sh, which needs tiny-draft and the fixtures but remakes the goldens)
#        bash scripts/device_tree.sh in    (after it; never while a local ctest runs between the two)
set -euo pipefail
cd "$(dirname "$0")/.."
stash=${EXL3_DEVICE_STASH:-/tmp/exl3-device-stash}
paths=(tests/models/golden tests/models/tiny-draft tests/fixtures)
[ $# -gt 1 ] && [ "$1" = out ] && paths=("${@:2}")
case "${1:-}" in
  out)
    [ -e "$stash" ] && { echo "$stash exists: run '$0 in' first" >&2; exit 1; }
    for p in "${paths[@]}"; do mkdir -p "$stash/$(dirname "$p")"; mv "$p" "$stash/$p"; done
    echo "moved ${paths[*]} to $stash" ;;
  in)
    for p in "${paths[@]}"; do
      [ -e "$stash/$p" ] || continue
      [ -e "$p" ] && { echo "$p is back already" >&2; exit 1; }
      mv "$stash/$p" "$p"
    done
    rm -rf "$stash"; git status --short | head -5 ;;
  *) echo "usage: $0 out|in" >&2; exit 2 ;;
esac
