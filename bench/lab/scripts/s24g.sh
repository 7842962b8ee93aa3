#!/usr/bin/env bash
# Session 24 run G: the Python module (built here, build-py) with the model on CUDA: tests/python/test_exl3.py,
# speculative decoding's options included (the draft's warm-up runs when a Generator is created).
set -uo pipefail
mkdir -p /tmp/py && tar xJf .device/py/py.tar.xz -C /tmp/py
PYTHONPATH=/tmp/py EXL3_TEST_DEVICE=cuda python3 tests/python/test_exl3.py -v 2>&1 | tail -8
