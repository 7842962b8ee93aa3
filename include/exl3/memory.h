// GPU memory planning (docs/memory.md): what a model takes on its GPU, computed before anything is allocated from the
// config and the tensors' headers, fitted to a budget (LoadOptions::gpu_memory), printed by the load log and by
// `exl3 inspect --memory`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace exl3 {

// How offloaded layers run (LoadOptions::offload_layers).
enum class OffloadMode {
    kStream,  // their weights are copied over PCIe into a GPU staging buffer each step, overlapped with the compute
              // of the layer before; the GPU computes them
    kCpu,     // the CPU threads compute them; the residual stream goes down before them and up after them
};

// The default budget leaves this much of what the device has free (other processes, the driver, fragmentation).
constexpr int64_t kGpuMemoryMargin = int64_t{512} << 20;
// LoadOptions::max_step_tokens when 0: kLargeMaxStepTokens where memory is plentiful (the plan keeps the same
// context with them and they take at most a sixteenth of the budget: a 2048-token prompt is one step, where prefill
// runs at its best), else kDefaultMaxStepTokens.
constexpr int kDefaultMaxStepTokens = 512;
constexpr int kLargeMaxStepTokens = 2048;
// With cache_tokens 0 the KV cache takes what the budget leaves, up to this many full-length sequences.
constexpr int kMaxCacheSequences = 64;
// The smallest context an automatically shortened context may have.
constexpr int kMinAutoContext = 256;

struct MemoryItem {
    std::string name;    // "weights: layers 0-79 (EXL3 linears)", "KV cache", "CUDA context", ...
    std::string detail;  // how it was counted ("16384 tokens x 102400 B", "estimate")
    int64_t bytes = 0;
};

struct MemoryPlan {
    std::string device;         // "cuda:0"
    std::string device_name;    // empty without a GPU
    int64_t device_total = 0;   // 0: not asked (no GPU, or a budget given and no device present)
    int64_t device_free = 0;
    int64_t budget = 0;         // what the plan must fit in
    bool budget_given = false;  // LoadOptions::gpu_memory, else the device's free memory minus kGpuMemoryMargin
    std::string budget_note;    // why the budget differs from the one given (the device has less free)

    std::vector<MemoryItem> gpu;   // every GPU allocation, by kind; their sum is gpu_total()
    std::vector<MemoryItem> host;  // what stays in (pinned) host memory instead: embeddings, offloaded weights

    // The resolved settings.
    int context_length = 0;
    bool context_shortened = false;  // the model's own context did not fit and was shortened
    int cache_tokens = 0;
    int page_size = 0;
    int kv_bits_k = 0, kv_bits_v = 0;
    int64_t kv_bytes_per_token = 0;  // every layer's keys and values of one token
    int max_step_tokens = 0;
    int sampler_rows = 0;            // rows the GPU sampler draws at a time (more in chunks; 0: no GPU sampler)
    int offload_layers = 0;          // the last offload_layers layers' weights are in host memory
    OffloadMode offload_mode = OffloadMode::kStream;
    int offload_expert_layers = 0;   // MoE layers whose experts run on the CPU
    bool embed_on_gpu = false;

    bool fits = false;
    int64_t short_by = 0;                  // bytes over the budget (when it does not fit)
    std::vector<std::string> suggestions;  // what would make it fit

    int64_t gpu_total() const {
        int64_t n = 0;
        for (const auto& i : gpu) n += i.bytes;
        return n;
    }
    int64_t host_total() const {
        int64_t n = 0;
        for (const auto& i : host) n += i.bytes;
        return n;
    }
    // The breakdown as a text table (GiB and MiB), the budget and the verdict: the load log and `exl3 inspect
    // --memory` print it.
    std::string table() const;
    // The refusal: the bytes short and the choices that would make it fit.
    std::string refusal() const;
};

}  // namespace exl3
