#include "models/memory_plan.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace exl3 {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

std::string gib(int64_t b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / kGiB); }

// "layers 0-71", "layer 3", "no layers".
std::string layer_range(int a, int b) {
    if (b <= a) return "no layers";
    return b - a == 1 ? fmt::format("layer {}", a) : fmt::format("layers {}-{}", a, b - 1);
}

std::string bits_name(int bits) { return bits == 0 ? "16" : std::to_string(bits); }

// One way of placing the model: every choice the options leave open, resolved.
struct Choice {
    int context = 0;
    bool context_given = false;
    int cache_tokens = 0;  // 0: what the budget leaves
    int bits_k = 0, bits_v = 0;
    int offload = 0;  // the last `offload` layers' weights in host memory
    OffloadMode mode = OffloadMode::kStream;
    int expert_layers = 0;  // the first `expert_layers` MoE layers' blocks on the CPU
    bool embed_gpu = false;
    int step_tokens = 0;
    int sampler_rows = 0;
    bool graphs = true;
};

class Planner {
public:
    Planner(const ModelConfig& cfg, const DeviceCosts& costs, const PlanInput& in, int64_t budget)
        : cfg_(cfg), costs_(costs), in_(in), budget_(budget) {
        for (int i = 0; i < cfg.num_layers; ++i)
            if (cfg.is_moe(i)) moe_layers_.push_back(i);
    }
    int moe_layer_count() const { return static_cast<int>(moe_layers_.size()); }

    // The plan of a choice: every item, the KV cache resolved, fits or not.
    MemoryPlan build(const Choice& c) const;
    // build(), with a context that was not given shortened to the longest that fits (kMinAutoContext at least).
    MemoryPlan fit(Choice c) const;
    // The longest context (a multiple of the page size, >= kMinAutoContext) that fits with the rest of `c`; 0: none.
    int longest_context(Choice c) const;
    std::vector<std::string> suggestions(const Choice& c, const MemoryPlan& p) const;

private:
    bool moe_on_host(const Choice& c, int layer) const {
        for (int k = 0; k < c.expert_layers && k < moe_layer_count(); ++k)
            if (moe_layers_[static_cast<size_t>(k)] == layer) return true;
        return false;
    }
    // A layer's bytes on the device as placed (its MoE block left out when it runs on the CPU).
    int64_t layer_bytes(const Choice& c, int layer) const {
        const LayerDeviceBytes& l = costs_.layers[static_cast<size_t>(layer)];
        return l.total() - (moe_on_host(c, layer) ? l.moe : 0);
    }
    bool fits_with(Choice c, const std::function<void(Choice&)>& change) const {
        change(c);
        return build(c).fits;
    }

    const ModelConfig& cfg_;
    const DeviceCosts& costs_;
    const PlanInput& in_;
    int64_t budget_;
    std::vector<int> moe_layers_;
};

MemoryPlan Planner::build(const Choice& c) const {
    MemoryPlan p;
    p.device = in_.device;
    p.budget = budget_;
    p.budget_given = in_.options.gpu_memory > 0;
    if (in_.device_memory) {
        p.device_name = in_.device_memory->name;
        p.device_total = in_.device_memory->total;
        p.device_free = in_.device_memory->free;
    }
    const int L = cfg_.num_layers, first_off = L - c.offload;
    int64_t exl3 = 0, dense = 0, norms = costs_.final_norm, moe = 0, off = 0, slot = 0, host_moe = 0;
    for (int i = 0; i < L; ++i) {
        const LayerDeviceBytes& l = costs_.layers[static_cast<size_t>(i)];
        const bool moe_host = moe_on_host(c, i);
        if (moe_host) host_moe += l.moe;
        if (i >= first_off) {
            off += layer_bytes(c, i);
            slot = std::max(slot, layer_bytes(c, i));
            continue;
        }
        exl3 += l.exl3;
        dense += l.dense;
        norms += l.norms;
        if (!moe_host) moe += l.moe;
    }
    const std::string resident = layer_range(0, first_off);
    if (exl3) p.gpu.push_back({"layers: EXL3 linears", resident, exl3});
    if (dense) p.gpu.push_back({"layers: unquantized linears", resident, dense});
    p.gpu.push_back({"layers: norms", resident + " and the final norm", norms});
    if (moe) p.gpu.push_back({"layers: MoE blocks", "routers, routed and shared experts", moe});
    if (costs_.head_tied)
        p.gpu.push_back({"head", "tied: the embedding table, which the lookup reads too", costs_.head});
    else
        p.gpu.push_back({"head", costs_.head_exl3 ? "EXL3" : "unquantized", costs_.head});
    if (!costs_.head_tied) {
        if (c.embed_gpu)
            p.gpu.push_back({"embeddings", "the table on the GPU (--embed-on-gpu)", costs_.embed});
        else
            p.host.push_back({"embeddings", "pinned; the lookup reads each step's rows over PCIe", costs_.embed});
    }
    const bool stream = c.offload > 0 && c.mode == OffloadMode::kStream;
    if (stream) {
        const int slots = std::min(c.offload, 2);
        p.gpu.push_back({"offload staging", fmt::format("{} slot{} of the largest streamed layer", slots,
                                                        slots == 1 ? "" : "s"),
                         slots * slot});
        p.host.push_back({"offloaded layers", fmt::format("pinned; {} copied up each step", layer_range(first_off, L)),
                          off});
        if (costs_.pinned_map_per_gib)
            p.gpu.push_back({"offload mappings", "estimate: the GPU's page tables of the pinned layers",
                             (off * costs_.pinned_map_per_gib + (int64_t{1} << 30) - 1) >> 30});
    } else if (c.offload > 0) {
        p.host.push_back({"offloaded layers", layer_range(first_off, L) + " run by the CPU, read in place", off});
    }
    if (host_moe)
        p.host.push_back({"MoE blocks on the CPU", fmt::format("{} layers, read in place", c.expert_layers), host_moe});
    const int rows = std::min(c.step_tokens, costs_.max_logit_rows);
    p.gpu.push_back({"step buffers and workspaces",
                     fmt::format("steps of up to {} tokens, {} logit rows", c.step_tokens, rows),
                     costs_.step_bytes(c.step_tokens, c.context)});
    if (costs_.sampler_bytes && c.sampler_rows > 0)
        p.gpu.push_back({"sampler", fmt::format("{} rows at a time, reserved at load", c.sampler_rows),
                         costs_.sampler_bytes(c.sampler_rows)});
    if (c.graphs && c.offload == 0 && std::min(c.expert_layers, moe_layer_count()) == 0 && costs_.capturable)
        p.gpu.push_back({"CUDA graphs", "estimate", costs_.graphs});
    p.gpu.push_back({"CUDA context, kernels, cuBLAS", "estimate", costs_.context});

    // The KV cache: what is left, or what was asked. Hybrid models: attention layers only hold keys and values; the
    // linear-attention layers' share of the cache buys their recurrent-state slots (DeviceCosts::state_slots), listed
    // beside it.
    const int ps = costs_.page_size;
    const int gpu_layers = c.mode == OffloadMode::kCpu ? first_off : L;
    const int kv_layers = cfg_.kv_layer(gpu_layers);
    const int64_t layer_token = costs_.kv_bytes_per_token_layer(c.bits_k, c.bits_v);
    const int64_t per_token = layer_token * kv_layers;
    const int64_t per_page = per_token * ps;
    const int64_t ctx_pages = (c.context + ps - 1) / ps;
    auto state_slots = [&](int64_t pages) {
        return costs_.state_slots ? costs_.state_slots(static_cast<int>(pages * ps), c.context, c.bits_k, c.bits_v) : 0;
    };
    int64_t pages = 0;
    if (c.cache_tokens > 0) {
        pages = std::max<int64_t>((c.cache_tokens + ps - 1) / ps, ctx_pages);
    } else {
        const int64_t cap = (static_cast<int64_t>(kMaxCacheSequences) * c.context + ps - 1) / ps;
        const int64_t left = budget_ - p.gpu_total();
        const int64_t sizing = layer_token * gpu_layers * ps;  // the linear layers' share included
        pages = sizing > 0 ? std::clamp<int64_t>(left / sizing, 0, cap) : cap;
        pages = std::min<int64_t>(std::max(pages, ctx_pages), (int64_t{1} << 30) / ps);
        // The states' floor (two a full-length sequence, eight at least) can outgrow their share: fewer pages then.
        for (int64_t over; per_page > 0 && pages > ctx_pages &&
                           (over = pages * per_page + state_slots(pages) * costs_.state_slot_bytes - left) > 0;)
            pages = std::max(ctx_pages, pages - std::max<int64_t>(1, (over + per_page - 1) / per_page));
    }
    p.cache_tokens = static_cast<int>(pages * ps);
    // Listed before the step buffers, the estimates after them.
    auto at = std::find_if(p.gpu.begin(), p.gpu.end(),
                           [](const MemoryItem& i) { return i.name == "step buffers and workspaces"; });
    at = p.gpu.insert(at, {"KV cache",
                           fmt::format("{} tokens ({} pages of {}) x {} B ({} layers, K {} / V {} bits)",
                                       p.cache_tokens, pages, ps, per_token, kv_layers, bits_name(c.bits_k),
                                       bits_name(c.bits_v)),
                           pages * per_page});
    if (costs_.state_slots) {
        const int slots = state_slots(pages);
        p.gpu.insert(at + 1, {"recurrent states",
                              fmt::format("{} slots x {} B ({} linear-attention layers; live states, their snapshots "
                                          "and the prefix cache's)",
                                          slots, costs_.state_slot_bytes, gpu_layers - kv_layers),
                              slots * costs_.state_slot_bytes});
    }
    if (c.mode == OffloadMode::kCpu && c.offload > 0)
        p.host.push_back({"KV cache of the CPU's layers", "at most (grows as it is used)",
                          costs_.host_kv_bytes_per_token_layer(c.bits_k, c.bits_v) * c.offload * pages * ps});

    p.context_length = c.context;
    p.page_size = ps;
    p.kv_bits_k = c.bits_k;
    p.kv_bits_v = c.bits_v;
    p.kv_bytes_per_token = per_token;
    p.max_step_tokens = c.step_tokens;
    p.sampler_rows = c.sampler_rows;
    p.offload_layers = c.offload;
    p.offload_mode = c.mode;
    p.offload_expert_layers = std::min(c.expert_layers, moe_layer_count());
    p.embed_on_gpu = c.embed_gpu || costs_.head_tied;
    // (The cache holds one context at least: a context that does not fit makes the plan short.)
    p.short_by = std::max<int64_t>(0, p.gpu_total() - budget_);
    p.fits = p.short_by == 0;
    return p;
}

int Planner::longest_context(Choice c) const {
    const int ps = costs_.page_size;
    int lo = 0, hi = std::max(0, c.context / ps);  // in pages
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        c.context = mid * ps;
        if (c.context >= kMinAutoContext && build(c).fits)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo * ps >= kMinAutoContext ? lo * ps : 0;
}

MemoryPlan Planner::fit(Choice c) const {
    MemoryPlan p = build(c);
    if (p.fits || c.context_given) return p;
    const int ctx = longest_context(c);
    c.context = ctx > 0 ? ctx : std::min(c.context, kMinAutoContext);
    p = build(c);
    p.context_shortened = true;
    return p;
}

std::vector<std::string> Planner::suggestions(const Choice& c, const MemoryPlan& p) const {
    std::vector<std::string> out;
    // The KV cache at fewer bits, the most precise that fits.
    for (int b : {8, 6, 4}) {
        const int k = c.bits_k == 0 ? 16 : c.bits_k, v = c.bits_v == 0 ? 16 : c.bits_v;
        if (b >= std::max(k, v)) continue;
        Choice q = c;
        q.bits_k = std::min(k, b) == 16 ? 0 : std::min(k, b);
        q.bits_v = std::min(v, b) == 16 ? 0 : std::min(v, b);
        if (const MemoryPlan f = build(q); f.fits) {
            out.push_back(fmt::format("--kv-bits {} (the KV cache at {} bits: {} tokens)", b, b, f.cache_tokens));
            break;
        }
    }
    if (const int ctx = longest_context(c); ctx > 0 && ctx < c.context)
        out.push_back(fmt::format("-c {} (the longest context that fits)", ctx));
    for (int n = c.offload + 1; n <= cfg_.num_layers; ++n)
        if (fits_with(c, [n](Choice& q) { q.offload = n; })) {
            out.push_back(fmt::format("--offload-layers {} ({} of {} layers' weights in host memory{})", n, n,
                                      cfg_.num_layers,
                                      c.mode == OffloadMode::kStream ? ", copied over PCIe each step" : ", run by the CPU"));
            break;
        }
    for (int n = c.expert_layers + 1; n <= moe_layer_count(); ++n)
        if (fits_with(c, [n](Choice& q) { q.expert_layers = n; })) {
            out.push_back(n == moe_layer_count()
                              ? std::string("--cpu-moe (every MoE block on the CPU)")
                              : fmt::format("--offload-experts {} (the MoE blocks of the first {} MoE layers on the CPU)", n, n));
            break;
        }
    if (c.embed_gpu && !costs_.head_tied && fits_with(c, [](Choice& q) { q.embed_gpu = false; }))
        out.push_back("the embedding table in host memory (no --embed-on-gpu)");
    if (c.step_tokens > 128 && fits_with(c, [](Choice& q) { q.step_tokens = 128; }))
        out.push_back("--max-step-tokens 128 (smaller step buffers; longer prompts run in more chunks)");
    if (in_.decoder_bpw > 0) {
        int64_t quantized = 0;  // what a conversion at fewer bits shrinks: the resident EXL3 linears
        for (const auto& it : p.gpu)
            if (it.name == "layers: EXL3 linears" || it.name == "layers: MoE blocks") quantized += it.bytes;
        const double bpw = in_.decoder_bpw * (1.0 - static_cast<double>(p.short_by) / std::max<int64_t>(quantized, 1));
        if (bpw >= 1.0)
            out.push_back(fmt::format("a conversion at about {:.2f} bits per weight or fewer (this one: {:.2f})",
                                      std::floor(bpw * 100.0) / 100.0, in_.decoder_bpw));
    }
    // The budget it needs as planned (the KV cache at one context).
    const double need_gib = std::ceil(static_cast<double>(p.gpu_total()) / kGiB * 10.0) / 10.0;
    if (!in_.device_memory || need_gib * kGiB <= static_cast<double>(in_.device_memory->free + costs_.context))
        out.push_back(fmt::format("--gpu-memory {:.1f}", need_gib));
    return out;
}

// The budget: given (at most what the device has free, when it is known), or the device's free memory minus the
// margin; the context estimate is added back because the context already exists when the device is asked.
Result<int64_t> budget_of(const PlanInput& in, const DeviceCosts& costs, std::string* note) {
    const auto& dm = in.device_memory;
    if (in.options.gpu_memory > 0) {
        if (dm && in.options.gpu_memory > dm->free + costs.context) {
            *note = fmt::format("the device has {} free: that is the budget", gib(dm->free + costs.context));
            return dm->free + costs.context;
        }
        return in.options.gpu_memory;
    }
    if (!dm) return invalid_argument("no GPU to ask for its free memory: give a budget (--gpu-memory GIB)");
    return std::max<int64_t>(0, dm->free + costs.context - kGpuMemoryMargin);
}

}  // namespace

std::string MemoryPlan::table() const {
    std::string s;
    s += fmt::format("GPU memory plan for {}", device);
    if (!device_name.empty())
        s += fmt::format(" ({}, {} total, {} free)", device_name, gib(device_total), gib(device_free));
    s += fmt::format(": budget {}{}{}\n", gib(budget),
                     budget_given ? "" : fmt::format(" (free memory less {:.0f} MiB)", kGpuMemoryMargin / kMiB),
                     budget_note.empty() ? "" : " (" + budget_note + ")");
    s += fmt::format("  {:<32} {:>10} {:>11}  {}\n", "on the GPU", "GiB", "MiB", "counted as");
    for (const auto& i : gpu)
        s += fmt::format("  {:<32} {:>10.3f} {:>11.1f}  {}\n", i.name, i.bytes / kGiB, i.bytes / kMiB, i.detail);
    s += fmt::format("  {:<32} {:>10.3f} {:>11.1f}  of {}\n", "total", gpu_total() / kGiB, gpu_total() / kMiB,
                     gib(budget));
    if (!host.empty()) {
        s += "  in host memory instead\n";
        for (const auto& i : host)
            s += fmt::format("  {:<32} {:>10.3f} {:>11.1f}  {}\n", i.name, i.bytes / kGiB, i.bytes / kMiB, i.detail);
    }
    if (fits)
        s += fmt::format("  fits: context {}{}, KV cache {} tokens ({} B a token), {} left\n", context_length,
                         context_shortened ? " (the model's did not fit: shortened)" : "", cache_tokens,
                         kv_bytes_per_token, gib(budget - gpu_total()));
    else
        s += "  does not fit: " + refusal() + "\n";
    return s;
}

std::string MemoryPlan::refusal() const {
    std::string s = fmt::format("the plan needs {} on {}, {:.0f} MiB more than the budget of {}", gib(gpu_total()),
                                device, static_cast<double>(short_by) / kMiB, gib(budget));
    if (suggestions.empty()) return s + " (and nothing the options can change would make it fit)";
    s += ". It would fit with ";
    for (size_t i = 0; i < suggestions.size(); ++i)
        s += (i == 0 ? "" : i + 1 == suggestions.size() ? ", or " : ", ") + suggestions[i];
    return s;
}

Result<MemoryPlan> plan_memory(const ModelConfig& cfg, const DeviceCosts& costs, const PlanInput& in) {
    const LoadOptions& o = in.options;
    std::string note;
    EXL3_ASSIGN_OR_RETURN(const int64_t budget, budget_of(in, costs, &note));
    Planner planner(cfg, costs, in, budget);
    Choice c;
    c.context_given = o.context_length > 0;
    c.context = c.context_given ? o.context_length : in.model_context;
    c.cache_tokens = o.cache_tokens;
    c.bits_k = o.kv_bits_k;
    c.bits_v = o.kv_bits_v;
    c.mode = o.offload_mode;
    c.offload = std::clamp(o.offload_layers, 0, cfg.num_layers);
    c.expert_layers = o.offload_experts < 0 ? planner.moe_layer_count() : std::min(o.offload_experts, planner.moe_layer_count());
    c.embed_gpu = o.embed_on_gpu;
    c.step_tokens = o.max_step_tokens > 0 ? o.max_step_tokens : kDefaultMaxStepTokens;
    c.graphs = o.cuda_graphs;
    c.sampler_rows = costs.sampler_rows;
    // Short of memory, the sampler draws fewer rows at a time first: only large batches notice (more chunks).
    if (costs.min_sampler_rows > 0 && costs.min_sampler_rows < c.sampler_rows && !planner.build(c).fits)
        c.sampler_rows = costs.min_sampler_rows;
    // Steps of 2048 tokens where memory is plentiful: the same context as with 512 and a sixteenth of the budget at
    // most (on the H100 a 2048-token MoE prefill ran at 9,844 tok/s in steps of 512, 16,327 in one step).
    if (o.max_step_tokens <= 0 && o.offload_layers == 0) {
        Choice big = c;
        big.step_tokens = kLargeMaxStepTokens;
        const MemoryPlan pb = planner.fit(big), ps = planner.fit(c);
        int64_t steps = 0;
        for (const auto& i : pb.gpu)
            if (i.name == "step buffers and workspaces") steps = i.bytes;
        if (pb.fits && pb.context_length >= ps.context_length && steps * 16 <= budget) c.step_tokens = big.step_tokens;
    }
    MemoryPlan p;
    if (o.offload_layers < 0) {  // as few offloaded layers as make the context fit
        for (int n = 0; n <= cfg.num_layers; ++n) {
            c.offload = n;
            p = planner.build(c);
            if (p.fits) break;
        }
    } else {
        p = planner.fit(c);
    }
    if (!p.fits) {
        c.context = p.context_length;
        p.suggestions = planner.suggestions(c, p);
    }
    p.budget_note = note;
    return p;
}

}  // namespace exl3
