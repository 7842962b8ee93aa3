set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
echo "== PlansFit"; /tmp/r1/exl3_cuda_tests --gtest_filter='*PlansFit*' 2>&1 | grep -E "limit [0-9]+ in|shared memory limit" | head -20
echo "== 99KB"; EXL3_SMEM_LIMIT=101376 /tmp/r1/exl3_cuda_tests 2>&1 | grep -E '^\[ *(FAILED|PASSED) ' | head -20
bash bench/lab/scripts/s21b_pair_lean_bench.sh
