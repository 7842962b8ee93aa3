#include "models/rank_memory.h"

#include <fmt/core.h>

#include <algorithm>

#include "models/memory_plan.h"

namespace exl3 {

Status RankMemoryPlanner::count(int rank, int device, const ModelConfig& cfg, const HostWeights& w,
                                const RankLink& link) {
    if (o_.offload_layers > cfg.num_layers)
        return invalid_argument(
            fmt::format("offload_layers = {}: the model has {} layers", o_.offload_layers, cfg.num_layers));
    if (ranks_ > 1 && (o_.offload_layers != 0 || o_.offload_experts != 0))
        return unsupported(fmt::format(
            "tensor parallelism over {} GPUs does not offload (--offload-layers / --offload-experts / --cpu-moe): "
            "each GPU holds its whole share of the model; split it over more GPUs, give each more --gpu-memory, or "
            "use a conversion at fewer bits",
            ranks_));
    ExecutorOptions eo = eo_;
    eo.device = device;
    eo.context_length = cfg.max_position_embeddings;
    eo.link = link;  // rank 0 of several counts the gathered logits
    Counted c;
    c.rank = rank;
    c.device = device;
    c.cfg = cfg;
    c.bpw = w.decoder_bpw;
    EXL3_ASSIGN_OR_RETURN(c.costs, cuda_device_costs(cfg, w, eo));
    counted_.push_back(std::move(c));
    return Status::ok();
}

Result<MemoryPlan> RankMemoryPlanner::plan_rank(const Counted& c, const LoadOptions& o) const {
    PlanInput in;
    in.options = o;
    in.model_context = c.cfg.max_position_embeddings;
    in.device = ranks_ > 1 ? fmt::format("cuda:{} (rank {} of {})", c.device, c.rank, ranks_)
                           : fmt::format("cuda:{}", c.device);
    in.decoder_bpw = c.bpw;
    if (ask_device_ || o.gpu_memory == 0) {
        auto dm = cuda_device_memory(c.device);
        if (dm.is_ok())
            in.device_memory = *dm;
        else if (o.gpu_memory == 0)
            return dm.status().with_context("planning GPU memory without a budget (--gpu-memory)");
    }
    return plan_memory(c.cfg, c.costs, in);
}

Result<std::vector<MemoryPlan>> RankMemoryPlanner::plan() const {
    if (counted_.empty()) return internal_error("a memory plan of no ranks");
    std::vector<MemoryPlan> plans;
    for (const Counted& c : counted_) {
        EXL3_ASSIGN_OR_RETURN(MemoryPlan p, plan_rank(c, o_));
        plans.push_back(std::move(p));
    }
    const bool all_fit = std::all_of(plans.begin(), plans.end(), [](const MemoryPlan& p) { return p.fits; });
    if (plans.size() == 1 || !all_fit) return plans;
    // The ranks share one page pool and one context: the smallest of theirs, which fits every rank.
    LoadOptions o = o_;
    o.context_length = plans[0].context_length;
    o.cache_tokens = plans[0].cache_tokens;
    for (const MemoryPlan& p : plans) {
        o.context_length = std::min(o.context_length, p.context_length);
        o.cache_tokens = std::min(o.cache_tokens, p.cache_tokens);
    }
    const bool shortened =
        std::any_of(plans.begin(), plans.end(), [](const MemoryPlan& p) { return p.context_shortened; });
    for (size_t r = 0; r < plans.size(); ++r) {
        EXL3_ASSIGN_OR_RETURN(plans[r], plan_rank(counted_[r], o));
        plans[r].context_shortened = shortened;
    }
    return plans;
}

Status RankMemoryPlanner::check(const std::vector<MemoryPlan>& plans) const {
    for (const MemoryPlan& p : plans)
        if (!p.fits)
            return out_of_range(ranks_ > 1 ? fmt::format("tensor parallelism, {}: {}", p.device, p.refusal())
                                           : p.refusal());
    return Status::ok();
}

ExecutorOptions RankMemoryPlanner::resolved(ExecutorOptions eo, const MemoryPlan& p) {
    eo.context_length = p.context_length;
    eo.cache_tokens = p.cache_tokens;
    eo.page_size = p.page_size;
    eo.max_step_tokens = p.max_step_tokens;
    eo.sampler_rows = p.sampler_rows;
    eo.offload_layers = p.offload_layers;
    eo.offload_mode = p.offload_mode;
    eo.offload_expert_layers = p.offload_expert_layers;
    eo.embed_on_gpu = p.embed_on_gpu;
    return eo;
}

}  // namespace exl3
