// Test and kernel-lab hooks of the CUDA backend: called by tests and benchmarks only, never by the library or the
// model. Kept apart so that a call from library code stands out.
#pragma once

namespace exl3::cuda::testing {

// Plan every kernel as on a GPU that allows no more than `bytes` of dynamic shared memory a block (e.g. 101376 for
// sm_86 / sm_89, 166912 for sm_80): current_device_smem_per_block() returns at most that, so the smaller GPUs' paths
// run on this one; <= 0 restores the device's own limit. Set it before the first kernel runs: the kernels' launchers
// cache what they derive from it (the attention shapes' occupancy, function attributes).
void set_smem_per_block_limit(long long bytes);
// current_device_smem_per_sm() returns `bytes` (> 0; <= 0 restores the device's own): the MoE plan's co-resident
// blocks as on that GPU, from a machine without one (tests/cuda/moe_plan_test.cpp).
void set_smem_per_sm(long long bytes);

}  // namespace exl3::cuda::testing
