// The CPU executor: the reference backend's ops (cpu_ops.h) over host KV pages that grow with the page pool, and a
// hybrid model's recurrent states in host slots that grow with its state pool.
#include <fmt/core.h>

#include "backend/cpu/cpu_ops.h"
#include "kv/host_pages.h"
#include "kv/host_states.h"
#include "models/executor.h"

namespace exl3 {

namespace {

class CpuExecutor final : public Executor {
public:
    CpuExecutor(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool, const ExecutorOptions& o)
        : cfg_(cfg), w_(w), pool_(pool), opts_(o),
          kv_(cfg.num_kv_layers(), page_size(o), cfg.num_kv_heads, cfg.head_dim, o.kv_bits_k, o.kv_bits_v),
          states_(recurrent_layers(cfg), cfg.lin_conv_floats() + cfg.lin_state_floats()) {}

    std::string device() const override { return "cpu"; }

    PagePoolOptions page_pool_options() const override {
        // The pages grow as they are needed; past cache_tokens (0: the context length) cached prefix pages are
        // evicted before the arena grows, and a cache_tokens given is also a hard limit.
        PagePoolOptions po;
        po.prefix_cache = opts_.prefix_cache;
        po.page_size = kv_.page_size();
        const int tokens = opts_.cache_tokens > 0 ? opts_.cache_tokens : opts_.context_length;
        po.capacity = (tokens + po.page_size - 1) / po.page_size;
        po.max_pages = opts_.cache_tokens > 0 ? po.capacity : 0;
        return po;
    }
    bool pages_preallocated() const override { return false; }
    int64_t kv_bytes_per_token() const override { return static_cast<int64_t>(kv_.bytes_per_token()); }
    int64_t state_bytes() const override { return static_cast<int64_t>(states_.bytes_per_slot()); }
    Status copy_states(const std::vector<std::pair<int32_t, int32_t>>& copies) override {
        for (const auto& [from, to] : copies) states_.copy(from, to);
        return Status::ok();
    }

    Status forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits) override {
        // (Ranks of a sharded model other than 0 hand their logits to rank 0's.)
        if (!logits && !opts_.link.sharded()) return invalid_argument("the CPU executor returns logits on the host");
        for (const Sequence::Impl* q : seqs) {
            if (q->pool) kv_.grow(q->pool->pages());  // memory behind every page (and state) id the pools created
            if (q->states) states_.grow(q->states->slots());
        }
        CpuOps ops(cfg_, w_, pool_, kv_, seqs);
        ops.set_link(&opts_.link);
        ops.set_states(&states_);
        return decoder_forward(ops, cfg_, plan, logits);
    }

private:
    static int page_size(const ExecutorOptions& o) { return o.page_size > 0 ? o.page_size : 16; }
    // Model layer -> its index among the recurrent (linear-attention) layers, or -1.
    static std::vector<int> recurrent_layers(const ModelConfig& c) {
        std::vector<int> r(static_cast<size_t>(c.num_layers), -1);
        for (int i = 0, n = 0; i < c.num_layers; ++i)
            if (c.is_linear(i)) r[static_cast<size_t>(i)] = n++;
        return r;
    }

    const ModelConfig& cfg_;
    const HostWeights& w_;
    ThreadPool& pool_;
    ExecutorOptions opts_;
    HostKvPages kv_;
    HostStates states_;
};

}  // namespace

Result<std::unique_ptr<Executor>> make_cpu_executor(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool,
                                                    const ExecutorOptions& opts) {
    return std::unique_ptr<Executor>(std::make_unique<CpuExecutor>(cfg, w, pool, opts));
}

}  // namespace exl3
