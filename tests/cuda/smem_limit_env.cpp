// EXL3_SMEM_LIMIT=<bytes> in the environment of the CUDA test binary: every kernel plans as on a GPU that allows no
// more shared memory a block (e.g. 101376 for sm_86 / sm_89), so the whole suite runs the smaller GPUs' paths on this
// one (bench/lab/scripts/s22a.sh). The library reads no environment; the test binary sets the hook before any test.
#include <cstdlib>

#include "backend/cuda/device_testing.h"

namespace {

const bool kSmemLimitFromEnv = [] {
    const char* e = std::getenv("EXL3_SMEM_LIMIT");
    if (e && *e) exl3::cuda::testing::set_smem_per_block_limit(std::atoll(e));
    return true;
}();

}  // namespace
