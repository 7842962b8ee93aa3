#!/usr/bin/env bash
# The Python module on the GPU machine: its tests with the model on CUDA (EXL3_TEST_DEVICE=cuda), then generation
# speed through it on the 8B-shaped EXL3 4.0 bpw model (bench/python_generate.py; set beside `exl3 bench`). The
# module is built on the Debian machine for the GPU machine's Python (3.12) and packed into .device/py:
#   cmake -S . -B build-py -G Ninja -DEXL3_CUDA_ARCHS=90 -DEXL3_BUILD_BENCH=OFF \
#     -DPython3_EXECUTABLE=/root/.pyenv/versions/3.12.1/bin/python3.12 && cmake --build build-py --target exl3_python
#   mkdir -p .device/py && tar cJf .device/py/py.tar.xz -C build-py/python exl3
# then run this with carry [".device"].
set -uo pipefail
mkdir -p /tmp/py /tmp/models && tar xJf .device/py/py.tar.xz -C /tmp/py
python3 --version
nvidia-smi --query-gpu=name --format=csv,noheader
(python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b > /tmp/mk.log 2>&1) &
PYTHONPATH=/tmp/py EXL3_TEST_DEVICE=cuda python3 tests/python/test_exl3.py -v 2>&1 | tail -6
wait; tail -1 /tmp/mk.log
PYTHONPATH=/tmp/py python3 bench/python_generate.py -m /tmp/models/l8b --device cuda -b 1,8,32 -g 256 2>&1 | grep -v "exl3 info"
