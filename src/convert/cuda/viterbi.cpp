#include "convert/cuda/viterbi.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "convert/cuda/viterbi.cuh"
#include "core/thread_pool.h"
#include "quant/encoder.h"

namespace exl3::convert::cuda {

namespace {

Status cuda_status(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::ok();
    return internal_error(fmt::format("CUDA Viterbi: {}: {}", what, cudaGetErrorString(e)));
}

// Back-pointer scratch is one slot per resident block; at K = 1 a slot is 8 MiB. Cap the total so that small GPUs
// still work (fewer blocks then run at once).
constexpr size_t kMaxScratch = size_t{2} << 30;

}  // namespace

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

Result<std::unique_ptr<ViterbiEncoder>> ViterbiEncoder::create(int device) {
    const int n = device_count();
    if (n == 0) return unsupported("--device cuda: no CUDA device is visible (driver missing, or no GPU)");
    if (device < 0 || device >= n)
        return invalid_argument(fmt::format("CUDA device {} does not exist ({} visible)", device, n));
    std::unique_ptr<ViterbiEncoder> v(new ViterbiEncoder());
    v->device_ = device;
    EXL3_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
    cudaDeviceProp prop{};
    EXL3_RETURN_IF_ERROR(cuda_status(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
    v->name_ = prop.name;
    cudaStream_t s = nullptr;
    EXL3_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    v->stream_ = s;
    return v;
}

ViterbiEncoder::~ViterbiEncoder() {
    cudaSetDevice(device_);
    cudaFree(d_targets_);
    cudaFree(d_states_);
    cudaFree(d_cost_);
    cudaFree(d_back_);
    if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status ViterbiEncoder::reserve(int n, int K) {
    if (n > cap_tiles_) {
        cudaFree(d_targets_);
        cudaFree(d_states_);
        cudaFree(d_cost_);
        d_targets_ = nullptr;
        d_states_ = nullptr;
        d_cost_ = nullptr;
        cap_tiles_ = 0;
        const size_t m = static_cast<size_t>(n);
        EXL3_RETURN_IF_ERROR(cuda_status(cudaMalloc(&d_targets_, m * 256 * sizeof(float)), "cudaMalloc targets"));
        EXL3_RETURN_IF_ERROR(cuda_status(cudaMalloc(&d_states_, m * 256 * sizeof(uint16_t)), "cudaMalloc states"));
        EXL3_RETURN_IF_ERROR(cuda_status(cudaMalloc(&d_cost_, m * sizeof(float)), "cudaMalloc costs"));
        cap_tiles_ = n;
    }
    return reserve_scratch(K);
}

Status ViterbiEncoder::reserve_scratch(int K) {
    const int resident = viterbi_resident_blocks(K, device_);
    if (resident <= 0) return internal_error(fmt::format("CUDA Viterbi: no resident blocks for K = {}", K));
    const size_t need = std::min(kMaxScratch, viterbi_slot_bytes(K) * static_cast<size_t>(resident));
    if (back_bytes_ < need) {
        cudaFree(d_back_);
        d_back_ = nullptr;
        back_bytes_ = 0;
        // Fall back to less scratch (fewer concurrent blocks) when memory is short.
        size_t want = need;
        while (cudaMalloc(&d_back_, want) != cudaSuccess) {
            cudaGetLastError();
            d_back_ = nullptr;
            if (want < viterbi_slot_bytes(K)) return internal_error("CUDA Viterbi: out of device memory");
            want /= 2;
        }
        back_bytes_ = want;
    }
    return Status::ok();
}

bool ViterbiEncoder::on_gpu(int K) const {
    return viterbi_fits(K, device_, smem_limit_);
}

Status ViterbiEncoder::encode(const float* targets, int n, int K, quant::Codebook cb, uint16_t* states,
                              float* costs) {
    if (K < 1 || K > 8) return invalid_argument(fmt::format("CUDA Viterbi: K = {} (1..8)", K));
    if (n <= 0) return Status::ok();
    if (!on_gpu(K)) {
        const float* lut = quant::codebook_lut(cb);
        auto tiles = [&](size_t b, size_t e) {
            thread_local quant::TileEncoderScratch sc;
            for (size_t i = b; i < e; ++i) {
                const double c = quant::encode_tile(targets + i * 256, K, lut, states + i * 256, sc);
                if (costs) costs[i] = static_cast<float>(c);
            }
        };
        if (cpu_pool_)
            cpu_pool_->parallel_for(static_cast<size_t>(n), 1, tiles);
        else
            tiles(0, static_cast<size_t>(n));
        return Status::ok();
    }
    EXL3_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(reserve(n, K));
    const int resident = viterbi_resident_blocks(K, device_);
    if (resident <= 0) return internal_error(fmt::format("CUDA Viterbi: no resident blocks for K = {}", K));
    const int slots = static_cast<int>(std::min<size_t>(resident, back_bytes_ / viterbi_slot_bytes(K)));
    auto st = static_cast<cudaStream_t>(stream_);
    const size_t m = static_cast<size_t>(n);
    EXL3_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(d_targets_, targets, m * 256 * sizeof(float), cudaMemcpyHostToDevice, st), "copy targets"));
    EXL3_RETURN_IF_ERROR(cuda_status(
        viterbi_encode_tiles(d_targets_, n, K, static_cast<int>(cb), d_states_, d_cost_, d_back_, slots, st,
                             register_layout_),
        "kernel launch"));
    EXL3_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(states, d_states_, m * 256 * sizeof(uint16_t), cudaMemcpyDeviceToHost, st), "copy states"));
    if (costs)
        EXL3_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(costs, d_cost_, m * sizeof(float), cudaMemcpyDeviceToHost, st),
                                         "copy costs"));
    return cuda_status(cudaStreamSynchronize(st), "kernel");
}

Status ViterbiEncoder::encode_device(const float* d_targets, int n, int K, quant::Codebook cb, uint16_t* d_states,
                                     void* stream) {
    if (K < 1 || K > 8) return invalid_argument(fmt::format("CUDA Viterbi: K = {} (1..8)", K));
    if (n <= 0) return Status::ok();
    auto st = stream ? static_cast<cudaStream_t>(stream) : static_cast<cudaStream_t>(stream_);
    EXL3_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    const size_t m = static_cast<size_t>(n);
    if (!on_gpu(K)) {  // through the host: the CPU encoder
        std::vector<float> t(m * 256);
        std::vector<uint16_t> s(m * 256);
        EXL3_RETURN_IF_ERROR(cuda_status(
            cudaMemcpyAsync(t.data(), d_targets, t.size() * sizeof(float), cudaMemcpyDeviceToHost, st), "copy targets"));
        EXL3_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(st), "copy targets"));
        EXL3_RETURN_IF_ERROR(encode(t.data(), n, K, cb, s.data()));
        EXL3_RETURN_IF_ERROR(cuda_status(
            cudaMemcpyAsync(d_states, s.data(), s.size() * sizeof(uint16_t), cudaMemcpyHostToDevice, st), "copy states"));
        return cuda_status(cudaStreamSynchronize(st), "copy states");
    }
    EXL3_RETURN_IF_ERROR(reserve_scratch(K));
    const int resident = viterbi_resident_blocks(K, device_);
    const int slots = static_cast<int>(std::min<size_t>(resident, back_bytes_ / viterbi_slot_bytes(K)));
    return cuda_status(viterbi_encode_tiles(d_targets, n, K, static_cast<int>(cb), d_states, nullptr, d_back_, slots, st,
                                            register_layout_),
                       "kernel launch");
}

Status ViterbiEncoder::codebook_values(quant::Codebook cb, float* out) {
    EXL3_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    EXL3_RETURN_IF_ERROR(reserve(256, 8));  // d_targets_ then holds 65536 floats
    auto st = static_cast<cudaStream_t>(stream_);
    EXL3_RETURN_IF_ERROR(cuda_status(viterbi_codebook_values(static_cast<int>(cb), d_targets_, st), "codebook"));
    EXL3_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(out, d_targets_, 65536 * sizeof(float), cudaMemcpyDeviceToHost, st), "copy codebook"));
    return cuda_status(cudaStreamSynchronize(st), "codebook kernel");
}

}  // namespace exl3::convert::cuda
