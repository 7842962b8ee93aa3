// The CUDA Viterbi tile encoder behind `exl3 convert --device cuda`: batches of tiles in, the same states
// quant::encode_tile gives out (viterbi.cu says how that is kept exact). Host memory on both sides; the device
// buffers and the back-pointer scratch are owned here and reused across calls. Built only with EXL3_HAVE_CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "exl3/status.h"
#include "quant/codebook.h"

namespace exl3 {
class ThreadPool;
}

namespace exl3::convert::cuda {

// CUDA devices usable by this process; 0 without a driver or a GPU (never an error).
int device_count();

class ViterbiEncoder {
public:
    static Result<std::unique_ptr<ViterbiEncoder>> create(int device = 0);
    ~ViterbiEncoder();
    ViterbiEncoder(const ViterbiEncoder&) = delete;
    ViterbiEncoder& operator=(const ViterbiEncoder&) = delete;

    // targets [n, 256] (sequence order) -> states [n, 256]; costs [n] (the path's squared error) when not null.
    // Where the K-bit kernel's block does not fit the GPU's shared memory (K = 1-2 on sm_86 / sm_89), the tiles are
    // encoded by quant::encode_tile instead (the same states and costs), on the pool set below or this thread.
    Status encode(const float* targets, int n, int K, quant::Codebook cb, uint16_t* states, float* costs = nullptr);
    // The same on device buffers, enqueued on `stream` (a cudaStream_t; null: this encoder's own) without waiting.
    // Where K is not on the GPU the tiles go through the host (and the call waits).
    Status encode_device(const float* d_targets, int n, int K, quant::Codebook cb, uint16_t* d_states, void* stream);
    // Whether encode runs K on the GPU (else on the CPU, above).
    bool on_gpu(int K) const;
    void set_cpu_pool(ThreadPool* pool) { cpu_pool_ = pool; }
    // Tests: decide on_gpu as on a GPU whose blocks allow at most `bytes` of shared memory (e.g. 101376 for sm_86 /
    // sm_89); <= 0: the device's own limit.
    void set_smem_limit(long long bytes) { smem_limit_ = bytes; }
    // Tests and benches: false runs K = 2..5 on the earlier kernel layout (viterbi.cuh), for A/B timings.
    void set_register_layout(bool on) { register_layout_ = on; }

    // The codebook as the kernel computes it, [65536] (tests compare it with quant::codebook_lut).
    Status codebook_values(quant::Codebook cb, float* out);

    const std::string& device_name() const { return name_; }

private:
    ViterbiEncoder() = default;
    Status reserve(int n, int K);
    Status reserve_scratch(int K);

    int device_ = 0;
    std::string name_;
    void* stream_ = nullptr;  // cudaStream_t
    float* d_targets_ = nullptr;
    uint16_t* d_states_ = nullptr;
    float* d_cost_ = nullptr;
    uint8_t* d_back_ = nullptr;
    int cap_tiles_ = 0;
    size_t back_bytes_ = 0;
    ThreadPool* cpu_pool_ = nullptr;
    long long smem_limit_ = 0;
    bool register_layout_ = true;
};

}  // namespace exl3::convert::cuda
