// Host side of the step timeline (step_trace.h).
#include <cstdio>
#include <vector>

#include "backend/cuda/step_trace.h"

namespace exl3::cuda {

namespace {
std::vector<StepTraceSetter>& setters() {
    static std::vector<StepTraceSetter> s;
    return s;
}
StepTraceBuf g_host{};

cudaError_t arm(const StepTraceBuf& b) {
    for (StepTraceSetter set : setters())
        if (cudaError_t e = set(b); e != cudaSuccess) return e;
    return cudaSuccess;
}
}  // namespace

bool step_trace_register(StepTraceSetter set) {
    setters().push_back(set);
    return true;
}

bool step_trace_compiled() {
#ifdef EXL3_STEP_TRACE
    return true;
#else
    return false;
#endif
}

cudaError_t step_trace_start(unsigned int records) {
    if (!step_trace_compiled() || g_host.rec) return cudaErrorInvalidValue;
    StepTraceBuf b{};
    if (cudaError_t e = cudaMalloc(&b.rec, 32ull * records); e != cudaSuccess) return e;
    cudaError_t e = cudaMalloc(&b.n, sizeof(unsigned int));
    if (e == cudaSuccess) e = cudaMemset(b.n, 0, sizeof(unsigned int));
    if (e != cudaSuccess) {  // nothing stays allocated on a failed start
        cudaFree(b.n);
        cudaFree(b.rec);
        return e;
    }
    b.cap = records;
    g_host = b;
    return arm(b);
}

cudaError_t step_trace_stop(const std::string& path) {
    if (!g_host.rec) return cudaErrorInvalidValue;
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return e;
    if (cudaError_t e = arm(StepTraceBuf{}); e != cudaSuccess) return e;
    unsigned int n = 0;
    if (cudaError_t e = cudaMemcpy(&n, g_host.n, sizeof n, cudaMemcpyDeviceToHost); e != cudaSuccess) return e;
    if (n > g_host.cap) n = g_host.cap;
    std::vector<unsigned long long> rec(4ull * n + 1);
    rec[0] = n;
    if (n > 0) {
        cudaError_t e = cudaMemcpy(rec.data() + 1, g_host.rec, 32ull * n, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) return e;
    }
    cudaFree(g_host.rec);
    cudaFree(g_host.n);
    g_host = StepTraceBuf{};
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return cudaErrorInvalidValue;
    const bool ok = std::fwrite(rec.data(), sizeof(unsigned long long), rec.size(), f) == rec.size();
    return std::fclose(f) == 0 && ok ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace exl3::cuda
