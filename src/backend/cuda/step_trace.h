// Kernel lab: a timeline of a decode step's kernel chain (build option EXL3_STEP_TRACE, off by default; docs/kernels
// /exl3.md note 44). In a trace build every kernel's EXL3_GRID_DEPENDENCY_WAIT() also records, for thread 0 of each
// block, the global timer before and after the wait, the SM, the call site (file and line) and the block and grid;
// tools/bench/step_trace.py turns the records into where a step's time goes. In other builds these functions do
// nothing and the kernels are untouched.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace exl3::cuda {

// One record: 4 words, {before the wait, after it (ns, %globaltimer), file hash << 32 | line << 16 | SM id,
// threads a block << 48 | grid size << 24 | linear block index}.
struct StepTraceBuf {
    unsigned long long* rec;
    unsigned int* n;
    unsigned int cap;
};

// True in a build with the option on.
bool step_trace_compiled();
// Arms every kernel to record, up to `records` records (device memory allocated here).
cudaError_t step_trace_start(unsigned int records);
// Disarms, and writes the records to `path` (a count, then 4 words a record, little-endian uint64).
cudaError_t step_trace_stop(const std::string& path);

// Called once a translation unit by step_trace.cuh's registration (trace builds only).
using StepTraceSetter = cudaError_t (*)(const StepTraceBuf&);
bool step_trace_register(StepTraceSetter set);

}  // namespace exl3::cuda
