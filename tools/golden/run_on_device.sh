#!/usr/bin/env bash
# Makes the golden fixtures on the GPU test machine (torch + transformers there) and packs them into $OUT.
# Expects tiny-target copied to .device/models/tiny-target (carried); tiny-draft is in tests/models.
set -euo pipefail
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
python3 tools/golden/make_golden.py --out "$work" --tiny .device/models/tiny-target --tiny tests/models/tiny-draft "$@"
tar -C "$work" -czf "$OUT/golden.tar.gz" golden models 2>/dev/null || tar -C "$work" -czf "$OUT/golden.tar.gz" golden
ls -la "$OUT"
