#!/usr/bin/env bash
# Session 23 run I: the Python module with speculative decoding's options on CUDA (scripts/device_python.sh's tests).
set -uo pipefail
mkdir -p /tmp/py && tar xJf .device/py/py.tar.xz -C /tmp/py
PYTHONPATH=/tmp/py EXL3_TEST_DEVICE=cuda python3 tests/python/test_exl3.py -v 2>&1 | tail -8
