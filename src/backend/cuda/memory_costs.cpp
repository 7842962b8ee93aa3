// The CUDA executor's memory, counted before anything is allocated (models/executor.h: cuda_device_costs): the
// weights by the same upload() the executor runs, through a placer that only counts; the step buffers and workspaces
// by the functions StepState::reserve sizes them with; the sampler by the function its init allocates by.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>

#include "backend/cuda/kv_pages.h"
#include "backend/cuda/step_state.h"
#include "backend/cuda/weight_stream.h"
#include "kv/host_pages.h"
#include "models/executor.h"

namespace exl3 {

Result<DeviceCosts> cuda_device_costs(const ModelConfig& cfg, const HostWeights& w, const ExecutorOptions& opts) {
    const cuda::ActType act = cfg.dtype == DType::kF16 ? cuda::ActType::kF16 : cuda::ActType::kBF16;
    auto shapes = std::make_shared<cuda::DeviceWeights>();  // what the workspaces are sized from
    cuda::CountingPlacer pl(static_cast<size_t>(cfg.num_layers));
    EXL3_RETURN_IF_ERROR(shapes->upload(w, act, cfg, pl));  // the table counted on the GPU: the plan places it
    DeviceCosts c;
    c.layers = pl.layers();
    c.head_tied = shapes->embed.get() == nullptr;
    c.embed = c.head_tied ? 0 : pl.embed;
    c.head = pl.head;
    c.head_exl3 = !shapes->head_exl3.exl3_parts.empty();
    c.final_norm = pl.final_norm;
    c.context = cuda::kCudaContextBytes;
    c.graphs = cuda::kCudaGraphBytes;
    c.pinned_map_per_gib = cuda::kPinnedMapBytesPerGiB;
    c.sampler_rows = cuda::kPlannedSamplerRows;
    c.min_sampler_rows = cuda::kMinSamplerRows;
    // Every rank's sampler spans the whole vocabulary (under tensor parallelism cfg.vocab_size is the rank's share).
    c.sampler_bytes = [vocab = opts.link.vocab() > 0 ? opts.link.vocab() : cfg.vocab_size](int rows) {
        return static_cast<int64_t>(cuda::sampler_device_bytes(rows, vocab));
    };
    for (const cuda::DevLayer& l : shapes->layers)
        if (!l.moe.experts.empty() && !l.moe.grouped.ok()) c.capturable = false;
    c.page_size = opts.page_size > 0 ? opts.page_size : 64;
    c.max_logit_rows = cuda::kPlannedLogitRows;
    const int kv_heads = cfg.num_kv_heads, hd = cfg.head_dim;
    c.kv_bytes_per_token_layer = [kv_heads, hd](int bk, int bv) {
        return static_cast<int64_t>(kv_heads) *
               static_cast<int64_t>(cuda::kv_vector_bytes(hd, bk) + cuda::kv_vector_bytes(hd, bv));
    };
    const int ps = c.page_size;
    c.host_kv_bytes_per_token_layer = [ps, kv_heads, hd](int bk, int bv) {
        return static_cast<int64_t>(HostKvPages(1, ps, kv_heads, hd, bk, bv).bytes_per_token());
    };
    if (cfg.hybrid()) {
        c.state_slot_bytes = cuda::state_slot_bytes_for(cfg);
        c.state_slots = [cfg, per_layer = c.kv_bytes_per_token_layer](int tokens, int context, int bk, int bv) {
            return cuda::state_slots_for(cfg, tokens, context, per_layer(bk, bv));
        };
    }
    const bool invariant = opts.batch_invariant;
    const int bits_k = opts.kv_bits_k, bits_v = opts.kv_bits_v;
    const int gathered = opts.link.gathered_vocab();  // tensor parallelism's rank 0: the gathered logits
    // The EXL3 scratch walks every linear: counted once per step size (the planner asks many times).
    auto exl3_scratch = std::make_shared<std::map<int, int64_t>>();
    c.step_bytes = [cfg, shapes, exl3_scratch, ps, invariant, bits_k, bits_v, gathered](int tokens, int context) {
        const int rows = std::min(tokens, cuda::kPlannedLogitRows);
        const int batch = std::min(tokens, cuda::kPlannedBatch);
        const int max_pages = (context + ps - 1) / ps;
        int64_t n = static_cast<int64_t>(
            cuda::step_buffer_sizes(cfg, tokens, batch, rows, max_pages, gathered).device_total());
        auto it = exl3_scratch->find(tokens);
        if (it == exl3_scratch->end())
            it = exl3_scratch
                     ->emplace(tokens, static_cast<int64_t>(cuda::allocation_footprint(
                                           cuda::exl3_scratch_bytes(*shapes, tokens, rows))))
                     .first;
        n += it->second;
        if (invariant)
            n += static_cast<int64_t>(cuda::allocation_footprint(cuda::invariant_scratch_bytes(*shapes, cfg)));
        n += static_cast<int64_t>(cuda::moe_scratch_bytes(cfg, *shapes, tokens, invariant));
        n += static_cast<int64_t>(
            cuda::allocation_footprint(cuda::attention_scratch_bytes(cfg, tokens, context, bits_k, bits_v)));
        return n;
    };
    return c;
}

Result<DeviceMemory> cuda_device_memory(int device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return unsupported("no CUDA device is visible");
    }
    if (device < 0 || device >= count)
        return invalid_argument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                                " visible)");
    cudaDeviceProp p{};
    size_t free = 0, total = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaGetDeviceProperties(&p, device) != cudaSuccess ||
        cudaMemGetInfo(&free, &total) != cudaSuccess) {
        const cudaError_t e = cudaGetLastError();
        return internal_error(std::string("asking the GPU for its free memory: ") + cudaGetErrorString(e));
    }
    return DeviceMemory{p.name, static_cast<int64_t>(total), static_cast<int64_t>(free)};
}

}  // namespace exl3
