// Decode GEMV: cuBLAS vs our gemv on Llama-3-8B shapes, bf16, batch 1..4. Rotates over several weight copies
// so that no run is served from the 60 MB L2; prints time and achieved weight bandwidth beside the measured copy
// bandwidth of the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemv.cuh"

using namespace exl3;
using namespace exl3::cuda;

int main() {
    auto ctx = CudaContext::create(0);
    if (!ctx.is_ok()) {
        std::fprintf(stderr, "%s\n", ctx.status().to_string().c_str());
        return 1;
    }
    const double bw = measure_copy_bandwidth(0);
    struct Shape {
        const char* name;
        int m, k;
    };
    const Shape shapes[] = {{"8B.qkv (4096->6144)", 6144, 4096}, {"8B.o (4096->4096)", 4096, 4096},
                            {"8B.gate_up (4096->28672)", 28672, 4096}, {"8B.down (14336->4096)", 4096, 14336},
                            {"8B.head (4096->128256)", 128256, 4096}};
    std::printf("device copy bandwidth %.0f GB/s\n", bw / 1e9);
    std::printf("%-26s %2s %12s %10s %12s %10s\n", "shape", "n", "cuBLAS us", "GB/s", "gemv us", "GB/s");
    cudaStream_t s = (*ctx)->stream();
    for (const Shape& sh : shapes) {
        const size_t wbytes = static_cast<size_t>(sh.m) * sh.k * 2;
        const int copies = static_cast<int>(std::max<size_t>(2, (size_t{256} << 20) / wbytes + 1));
        std::vector<DeviceBuffer> ws(static_cast<size_t>(copies));
        for (auto& w : ws) {
            if (!w.reserve(wbytes).is_ok()) return 1;
            cudaMemset(w.get(), 0x3c, wbytes);  // 0x3c3c: a small non-zero bf16
        }
        DeviceBuffer x, y;
        if (!x.reserve(static_cast<size_t>(4) * sh.k * 2).is_ok() || !y.reserve(static_cast<size_t>(4) * sh.m * 4).is_ok())
            return 1;
        cudaMemset(x.get(), 0x3c, static_cast<size_t>(4) * sh.k * 2);
        for (int n = 1; n <= 4; ++n) {
            double us[2];
            for (int impl = 0; impl < 2; ++impl) {
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0);
                cudaEventCreate(&e1);
                const int iters = 50;
                std::vector<float> times;
                for (int rep = 0; rep < 5; ++rep) {
                    cudaEventRecord(e0, s);
                    for (int i = 0; i < iters; ++i) {
                        const void* w = ws[static_cast<size_t>(i % copies)].get();
                        if (impl == 0) {
                            Status st = [&] {
                                const float a = 1.0f, b = 0.0f;
                                return check_cublas(cublasGemmEx((*ctx)->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, sh.m, n,
                                                                 sh.k, &a, w, CUDA_R_16BF, sh.k, x.get(), CUDA_R_16BF,
                                                                 sh.k, &b, y.get(), CUDA_R_16BF, sh.m,
                                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                                    "gemm");
                            }();
                            if (!st.is_ok()) return 1;
                        } else {
                            gemv(x.get(), w, y.get(), ActType::kBF16, false, n, sh.m, sh.k, s);
                        }
                    }
                    cudaEventRecord(e1, s);
                    cudaEventSynchronize(e1);
                    float ms = 0;
                    cudaEventElapsedTime(&ms, e0, e1);
                    if (rep > 0) times.push_back(ms * 1000.0f / iters);
                }
                std::sort(times.begin(), times.end());
                us[impl] = times[times.size() / 2];
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
            }
            std::printf("%-26s %2d %12.1f %10.0f %12.1f %10.0f\n", sh.name, n, us[0], wbytes / us[0] / 1e3, us[1],
                        wbytes / us[1] / 1e3);
        }
    }
    if (cudaGetLastError() != cudaSuccess) return 1;
    return 0;
}
