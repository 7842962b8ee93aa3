#include "models/sharding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/log.h"
#include "quant/exl3_slice.h"

namespace exl3 {

namespace {

constexpr int kMaxRanks = 64;

// Counts of `units` given to ranks in proportion to `weights`, each at least one (largest remainders; ties to the
// lower rank). Needs units >= weights.size().
std::vector<int> apportion(int units, const std::vector<double>& weights) {
    const size_t n = weights.size();
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    std::vector<double> quota(n);
    std::vector<int> got(n);
    int sum = 0;
    for (size_t r = 0; r < n; ++r) {
        quota[r] = weights[r] / total * units;
        got[r] = std::max(1, static_cast<int>(std::floor(quota[r])));
        sum += got[r];
    }
    while (sum != units) {  // hand out (or take back) one unit at a time by how far each rank is from its quota
        size_t pick = n;
        for (size_t r = 0; r < n; ++r) {
            const double gap = quota[r] - got[r];
            if (sum > units && got[r] <= 1) continue;
            if (pick == n || (sum < units ? gap > quota[pick] - got[pick] : gap < quota[pick] - got[pick])) pick = r;
        }
        got[pick] += sum < units ? 1 : -1;
        sum += sum < units ? 1 : -1;
    }
    return got;
}

// [0, total) cut into ranges of whole units of `unit` (the last unit may be short), in proportion to `weights`.
std::vector<ShardRange> split(int total, int unit, const std::vector<double>& weights, int offset = 0) {
    const int units = (total + unit - 1) / unit;
    const std::vector<int> got = apportion(units, weights);
    std::vector<ShardRange> out;
    int u = 0;
    for (int g : got) {
        out.push_back({offset + std::min(total, u * unit), offset + std::min(total, (u + g) * unit)});
        u += g;
    }
    return out;
}

// The widest unit in which `total` gives every rank a share: 128 (EXL3's Hadamard blocks; also kind to dense
// kernels), then 16, 8, 1.
int pick_unit(int total, int ranks) {
    for (int u : {128, 16, 8})
        if ((total + u - 1) / u >= ranks) return u;
    return 1;
}

bool any_exl3(const HostLinear& l) {
    return std::any_of(l.parts.begin(), l.parts.end(), [](const HostPart& p) { return p.is_exl3(); });
}

Status check_units(const ModelConfig& cfg, const char* what, int total, int ranks) {
    if (total >= ranks) return Status::ok();
    return invalid_argument(fmt::format("{} cannot be split {} ways: it has {} {}", cfg.arch_name, ranks, total, what));
}

// Attention: whole kv heads per rank (q heads follow their groups); with more ranks than kv heads, each kv head is
// shared by a run of ranks that split its q heads.
Status plan_attention(const ModelConfig& cfg, const HostWeights& w, const std::vector<double>& weights,
                      ShardPlan* plan) {
    const int n = plan->ranks, H = cfg.num_heads, KV = cfg.num_kv_heads, g = H / KV, hd = cfg.head_dim;
    if (n > 1 && cfg.hybrid())
        return unsupported(fmt::format(
            "{} has Gated DeltaNet linear-attention layers, which tensor parallelism does not split yet (their state "
            "and convolution by heads): run it on one GPU",
            cfg.arch_name));
    if (n > 1 && cfg.qk_norm == QkNorm::kFlat)
        return unsupported(fmt::format(
            "{} normalises q and k over all heads at once (Olmo 2/3): that norm needs every head, so its attention "
            "cannot be split across ranks",
            cfg.arch_name));
    EXL3_RETURN_IF_ERROR(check_units(cfg, "attention heads", H, n));
    // EXL3 q/k/v/o slices on the 128-blocks: heads in runs of 128 / head_dim where that still gives every rank some.
    bool exl3 = false;
    for (const HostLayer& L : w.layers) exl3 = exl3 || any_exl3(L.qkv) || any_exl3(L.o);
    const int block_heads = exl3 && hd < 128 && 128 % hd == 0 ? 128 / hd : 1;
    if (n <= KV) {
        const int unit = KV % block_heads == 0 && KV / block_heads >= n ? block_heads : 1;
        const std::vector<ShardRange> kv = split(KV, unit, weights);
        for (int r = 0; r < n; ++r) {
            plan->shards[static_cast<size_t>(r)].kv_heads = kv[static_cast<size_t>(r)];
            plan->shards[static_cast<size_t>(r)].q_heads = {kv[static_cast<size_t>(r)].begin * g,
                                                            kv[static_cast<size_t>(r)].end * g};
        }
        return Status::ok();
    }
    plan->shared_kv = true;
    int r0 = 0;
    for (int j = 0; j < KV; ++j) {  // kv head j: ranks [r0, r0 + m) split its g q heads
        const int m = n / KV + (j < n % KV ? 1 : 0);
        const std::vector<double> sub(weights.begin() + r0, weights.begin() + r0 + m);
        const int unit = g % block_heads == 0 && g / block_heads >= m ? block_heads : 1;
        const std::vector<ShardRange> q = split(g, unit, sub, j * g);
        for (int i = 0; i < m; ++i) {
            RankShard& s = plan->shards[static_cast<size_t>(r0 + i)];
            s.q_heads = q[static_cast<size_t>(i)];
            s.kv_heads = {j, j + 1};
        }
        r0 += m;
    }
    return Status::ok();
}

// `field` of every rank: [0, total) in units of `unit` (0: pick_unit's).
Status plan_columns(const ModelConfig& cfg, const char* what, int total, int unit, const std::vector<double>& weights,
                    ShardRange RankShard::*field, ShardPlan* plan) {
    EXL3_RETURN_IF_ERROR(check_units(cfg, what, total, plan->ranks));
    const std::vector<ShardRange> parts = split(total, unit > 0 ? unit : pick_unit(total, plan->ranks), weights);
    for (int r = 0; r < plan->ranks; ++r) plan->shards[static_cast<size_t>(r)].*field = parts[static_cast<size_t>(r)];
    return Status::ok();
}

std::string sizes(const ShardPlan& p, ShardRange RankShard::*field) {
    std::string s;
    for (const RankShard& r : p.shards) s += (s.empty() ? "" : "+") + std::to_string((r.*field).size());
    return s;
}

// ---- slicing weights ------------------------------------------------------------------------------------------

class Slicer {
public:
    explicit Slicer(HostWeights* out) : out_(out) {}
    int dense_fallbacks() const { return fallbacks_; }

    // The parts' output columns: part i keeps cols[i] (in its own coordinates); the bias follows.
    Result<HostLinear> columns(const HostLinear& l, const std::vector<ShardRange>& cols) {
        if (cols.size() != l.parts.size())
            return internal_error(
                fmt::format("sharding: {} column ranges for a linear of {} parts", cols.size(), l.parts.size()));
        HostLinear r;
        r.in = l.in;
        int at = 0;
        for (size_t i = 0; i < cols.size(); ++i) {
            const HostPart& p = l.parts[i];
            const ShardRange c = cols[i];
            if (c == ShardRange{0, p.out}) {
                r.parts.push_back(p);
            } else {
                EXL3_ASSIGN_OR_RETURN(HostPart s, part_columns(p, l.in, c));
                r.parts.push_back(std::move(s));
            }
            if (!l.bias.empty())
                r.bias.insert(r.bias.end(), l.bias.begin() + at + c.begin, l.bias.begin() + at + c.end);
            r.out += c.size();
            at += p.out;
        }
        return r;
    }

    // Input columns `rows` of every part; the bias only where `keep_bias` (rank 0 of a row split).
    Result<HostLinear> rows(const HostLinear& l, ShardRange rows, bool keep_bias) {
        HostLinear r;
        r.in = rows.size();
        r.out = l.out;
        if (keep_bias) r.bias = l.bias;
        for (const HostPart& p : l.parts) {
            if (rows == ShardRange{0, l.in}) {
                r.parts.push_back(p);
                continue;
            }
            EXL3_ASSIGN_OR_RETURN(HostPart s, part_rows(p, l.in, rows));
            r.parts.push_back(std::move(s));
        }
        return r;
    }

private:
    Result<HostPart> part_columns(const HostPart& p, int in, ShardRange c) {
        HostPart s;
        s.out = c.size();
        if (!p.is_exl3()) {  // rows of the HF weight: a view
            const size_t row = static_cast<size_t>(in) * dtype_size(p.dense.dtype);
            s.dense = TensorView{static_cast<const uint8_t*>(p.dense.data) + row * static_cast<size_t>(c.begin),
                                 p.dense.dtype,
                                 {c.size(), in}};
            return s;
        }
        if (!quant::exl3_slice_aligned(c.begin, c.end, p.exl3->out_features)) return dense(*p.exl3, c, {0, in});
        std::vector<uint8_t> storage;
        EXL3_ASSIGN_OR_RETURN(quant::Exl3Linear q, quant::exl3_slice_columns(*p.exl3, c.begin, c.end, &storage));
        out_->owned.push_back(std::move(storage));  // the heap block the slice points into moves along
        s.exl3 = std::make_shared<const quant::Exl3Linear>(std::move(q));
        return s;
    }

    Result<HostPart> part_rows(const HostPart& p, int in, ShardRange r) {
        HostPart s;
        s.out = p.out;
        if (p.is_exl3()) {
            if (!quant::exl3_slice_aligned(r.begin, r.end, p.exl3->in_features)) return dense(*p.exl3, {0, p.out}, r);
            EXL3_ASSIGN_OR_RETURN(quant::Exl3Linear q, quant::exl3_slice_rows(*p.exl3, r.begin, r.end));
            s.exl3 = std::make_shared<const quant::Exl3Linear>(std::move(q));
            return s;
        }
        // Columns of the HF weight: strided, so copied (in the checkpoint's dtype).
        const size_t es = dtype_size(p.dense.dtype), n = static_cast<size_t>(r.size());
        std::vector<uint8_t> buf(static_cast<size_t>(p.out) * n * es);
        const auto* src = static_cast<const uint8_t*>(p.dense.data);
        for (size_t o = 0; o < static_cast<size_t>(p.out); ++o)
            std::memcpy(buf.data() + o * n * es,
                        src + (o * static_cast<size_t>(in) + static_cast<size_t>(r.begin)) * es, n * es);
        out_->owned.push_back(std::move(buf));
        s.dense = TensorView{out_->owned.back().data(), p.dense.dtype, {p.out, r.size()}};
        return s;
    }

    // An EXL3 slice off the 128-blocks: the dense fp32 weight of the slice.
    Result<HostPart> dense(const quant::Exl3Linear& q, ShardRange cols, ShardRange rows) {
        EXL3_ASSIGN_OR_RETURN(std::vector<float> w,
                              quant::exl3_slice_dense(q, cols.begin, cols.end, rows.begin, rows.end));
        const auto* b = reinterpret_cast<const uint8_t*>(w.data());
        out_->owned.emplace_back(b, b + w.size() * sizeof(float));
        ++fallbacks_;
        HostPart s;
        s.out = cols.size();
        s.dense = TensorView{out_->owned.back().data(), DType::kF32, {cols.size(), rows.size()}};
        return s;
    }

    HostWeights* out_;
    int fallbacks_ = 0;
};

std::vector<float> sub(const std::vector<float>& v, int begin, int end) {
    return std::vector<float>(v.begin() + begin, v.begin() + end);
}

Status shard_expert(Slicer& sl, const HostExpert& e, ShardRange cols, bool keep_bias, HostExpert* out) {
    EXL3_ASSIGN_OR_RETURN(out->gate_up, sl.columns(e.gate_up, {cols, cols}));
    EXL3_ASSIGN_OR_RETURN(out->down, sl.rows(e.down, cols, keep_bias));
    return Status::ok();
}

Status shard_layer(Slicer& sl, const ModelConfig& cfg, const ShardPlan& plan, const RankShard& s, const HostLayer& L,
                   int li, HostLayer* o) {
    // A hybrid model runs on one rank only (plan_attention refuses more): its layers (linear attention, gated
    // attention's q|gate heads) pass whole.
    if (cfg.hybrid()) {
        if (plan.ranks != 1) return internal_error("sharding: a hybrid model on more than one rank");
        *o = L;
        return Status::ok();
    }
    const int hd = cfg.head_dim;
    const ShardRange q{s.q_heads.begin * hd, s.q_heads.end * hd}, kv{s.kv_heads.begin * hd, s.kv_heads.end * hd};
    const bool first = s.rank == 0;
    o->attn_norm = L.attn_norm;
    o->mlp_norm = L.mlp_norm;
    o->post_attn_norm = L.post_attn_norm;
    o->post_mlp_norm = L.post_mlp_norm;
    const bool per_head = cfg.qk_norm == QkNorm::kHeads;  // [heads, head_dim]: the rank's heads' rows
    o->q_norm = per_head ? sub(L.q_norm, q.begin, q.end) : L.q_norm;
    o->k_norm = per_head ? sub(L.k_norm, kv.begin, kv.end) : L.k_norm;
    if (!L.sinks.empty()) o->sinks = sub(L.sinks, s.q_heads.begin, s.q_heads.end);  // one per q head (gpt-oss)
    if (L.qkv.parts.size() != 3)
        return internal_error(fmt::format("sharding: layer {}'s q|k|v has {} parts", li, L.qkv.parts.size()));
    EXL3_ASSIGN_OR_RETURN(o->qkv, sl.columns(L.qkv, {q, kv, kv}));
    EXL3_ASSIGN_OR_RETURN(o->o, sl.rows(L.o, q, first));
    if (!cfg.is_moe(li)) {
        EXL3_ASSIGN_OR_RETURN(o->gate_up, sl.columns(L.gate_up, {s.inter, s.inter}));
        EXL3_ASSIGN_OR_RETURN(o->down, sl.rows(L.down, s.inter, first));
        return Status::ok();
    }
    const HostMoe& m = L.moe;
    o->moe.router = m.router;
    o->moe.score_bias = m.score_bias;
    o->moe.shared_gate = m.shared_gate;
    o->moe.experts.resize(m.experts.size());  // the experts of other ranks stay empty (no parts)
    for (int e = s.experts.begin; e < s.experts.end; ++e)
        EXL3_RETURN_IF_ERROR(shard_expert(sl, m.experts[static_cast<size_t>(e)], s.expert_cols,
                                          !plan.split_experts || first, &o->moe.experts[static_cast<size_t>(e)]));
    if (!m.shared.gate_up.parts.empty())
        EXL3_RETURN_IF_ERROR(shard_expert(sl, m.shared, s.shared_cols, first, &o->moe.shared));
    return Status::ok();
}

}  // namespace

std::vector<int> ShardPlan::vocab_bounds() const {
    std::vector<int> b{0};
    for (const RankShard& s : shards) b.push_back(s.vocab.end);
    return b;
}

std::string ShardPlan::describe() const {
    std::string s =
        fmt::format("{} rank{}: heads {} (kv {}{})", ranks, ranks == 1 ? "" : "s", sizes(*this, &RankShard::q_heads),
                    sizes(*this, &RankShard::kv_heads), shared_kv ? ", shared" : "");
    if (!shards.empty() && shards[0].inter.size() > 0) s += ", mlp " + sizes(*this, &RankShard::inter);
    if (!shards.empty() && shards[0].experts.size() > 0)
        s += split_experts ? ", expert columns " + sizes(*this, &RankShard::expert_cols)
                           : ", experts " + sizes(*this, &RankShard::experts);
    return s + ", vocab " + sizes(*this, &RankShard::vocab);
}

Result<ShardPlan> plan_shards(const ModelConfig& cfg, const HostWeights& w, const ShardOptions& o) {
    const int n = o.ranks;
    if (n < 1 || n > kMaxRanks)
        return invalid_argument(fmt::format("tensor parallelism over {} ranks: 1 to {}", n, kMaxRanks));
    std::vector<double> weights = o.weights;
    if (weights.empty()) weights.assign(static_cast<size_t>(n), 1.0);
    if (static_cast<int>(weights.size()) != n)
        return invalid_argument(fmt::format("{} split weights for {} ranks", weights.size(), n));
    for (double x : weights)
        if (!std::isfinite(x) || x <= 0.0) return invalid_argument("split weights must be positive and finite");
    if (cfg.num_kv_heads <= 0 || cfg.num_heads % cfg.num_kv_heads != 0 ||
        w.layers.size() != static_cast<size_t>(cfg.num_layers))
        return invalid_argument("sharding: the config and the weights disagree");
    ShardPlan plan;
    plan.ranks = n;
    plan.split_experts = o.split_experts;
    plan.shards.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
        RankShard& s = plan.shards[static_cast<size_t>(r)];
        s.rank = r;
        s.inter = {0, cfg.intermediate_size};
        s.experts = {0, cfg.num_experts};
        s.expert_cols = {0, cfg.expert_size};
        s.shared_cols = {0, cfg.shared_expert_size};
    }
    EXL3_RETURN_IF_ERROR(plan_attention(cfg, w, weights, &plan));
    bool dense_mlp = false;
    for (int li = 0; li < cfg.num_layers; ++li) dense_mlp = dense_mlp || !cfg.is_moe(li);
    if (dense_mlp)
        EXL3_RETURN_IF_ERROR(
            plan_columns(cfg, "MLP intermediate columns", cfg.intermediate_size, 0, weights, &RankShard::inter, &plan));
    if (cfg.num_experts > 0 && n > 1) {
        if (o.split_experts) {
            EXL3_RETURN_IF_ERROR(
                plan_columns(cfg, "columns in an expert", cfg.expert_size, 0, weights, &RankShard::expert_cols, &plan));
        } else {
            if (cfg.num_experts < n)
                return invalid_argument(
                    fmt::format("{} has {} experts, fewer than {} ranks: split every expert instead (split experts)",
                                cfg.arch_name, cfg.num_experts, n));
            EXL3_RETURN_IF_ERROR(plan_columns(cfg, "experts", cfg.num_experts, 1, weights, &RankShard::experts, &plan));
        }
        if (cfg.shared_expert_size > 0)
            EXL3_RETURN_IF_ERROR(plan_columns(cfg, "columns in the shared expert", cfg.shared_expert_size, 0, weights,
                                              &RankShard::shared_cols, &plan));
    }
    EXL3_RETURN_IF_ERROR(plan_columns(cfg, "vocabulary entries", cfg.vocab_size, 0, weights, &RankShard::vocab, &plan));
    return plan;
}

ModelConfig shard_config(const ModelConfig& cfg, const RankShard& s) {
    ModelConfig c = cfg;
    c.num_heads = s.q_heads.size();
    c.num_kv_heads = s.kv_heads.size();
    c.intermediate_size = s.inter.size();
    c.vocab_size = s.vocab.size();
    c.expert_size = s.expert_cols.size();
    c.shared_expert_size = s.shared_cols.size();
    return c;
}

Status shard_weights(const HostWeights& full, const ModelConfig& cfg, const ShardPlan& plan, int rank,
                     HostWeights* out) {
    if (rank < 0 || rank >= plan.ranks) return invalid_argument(fmt::format("rank {} of {}", rank, plan.ranks));
    const RankShard& s = plan.shards[static_cast<size_t>(rank)];
    Slicer sl(out);
    out->names = full.names;
    out->embed = full.embed;
    out->final_norm = full.final_norm;
    out->quantization = full.quantization;
    out->num_parameters = full.num_parameters;
    if (full.head.parts.size() != 1) return internal_error("sharding: the head has one part");
    EXL3_ASSIGN_OR_RETURN(out->head, sl.columns(full.head, {s.vocab}));
    out->layers.resize(full.layers.size());
    for (size_t li = 0; li < full.layers.size(); ++li)
        EXL3_RETURN_IF_ERROR(shard_layer(sl, cfg, plan, s, full.layers[li], static_cast<int>(li), &out->layers[li])
                                 .with_context(fmt::format("rank {}, layer {}", rank, li)));
    if (sl.dense_fallbacks() > 0)
        log_warn(
            "rank {}: {} EXL3 slices do not lie on the 128-wide Hadamard blocks and run as dense fp32 weights of "
            "the slice (more memory, same values)",
            rank, sl.dense_fallbacks());
    return Status::ok();
}

}  // namespace exl3
