#include "convert/calib_forward.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/ops.h"
#include "kv/host_pages.h"
#include "kv/host_states.h"
#include "kv/sequence.h"
#include "models/decoder.h"

namespace exl3::convert {

namespace {

// h [d, d] += a^T x over the rows finite in x (and in xo, when given), a = x, or xo - x with xo (the shift); returns
// the rows summed.
int64_t add_products(std::vector<double>& h, const float* xo, const float* x, int T, int d, ThreadPool& pool) {
    if (h.empty()) h.assign(static_cast<size_t>(d) * d, 0.0);
    std::vector<int> ok;
    for (int t = 0; t < T; ++t) {
        bool f = true;
        const size_t o = static_cast<size_t>(t) * d;
        for (int i = 0; i < d && f; ++i) f = std::isfinite(x[o + i]) && (!xo || std::isfinite(xo[o + i]));
        if (f) ok.push_back(t);
    }
    pool.parallel_for(static_cast<size_t>(d), 4, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
            double* hr = h.data() + i * d;
            for (int t : ok) {
                const float* xr = x + static_cast<size_t>(t) * d;
                const double ai = xo ? static_cast<double>(xo[static_cast<size_t>(t) * d + i]) - xr[i] : xr[i];
                if (ai == 0.0) continue;
                for (int j = 0; j < d; ++j) hr[j] += ai * xr[j];
            }
        }
    });
    return static_cast<int64_t>(ok.size());
}

}  // namespace

void Hess::add(const float* x, int T, int d, ThreadPool& pool) {
    rows += add_products(h, nullptr, x, T, d, pool);
}

void Hess::add_shift(const float* xo, const float* x, int T, int d, ThreadPool& pool) {
    rows += add_products(h, xo, x, T, d, pool);
}

namespace {

// The calibration rows as one step of `rows` sequences of `cols` tokens each (positions 0 .. cols-1), no logits.
StepPlan calibration_plan(const Calib& cs) {
    StepPlan p;
    p.q_start.push_back(0);
    for (int r = 0; r < cs.rows; ++r) {
        for (int i = 0; i < cs.cols; ++i) {
            p.tokens.push_back(0);  // the state is given: no embedding
            p.positions.push_back(i);
        }
        p.q_start.push_back(p.total());
        p.seq_len.push_back(cs.cols);
    }
    p.max_seq_len = cs.cols;
    return p;
}

// act(x Wg^T + bg) * (x Wu^T + bu) [rows, width] of one expert (the converter's fp32 copies: dense parts; the
// biases where the family has them).
std::vector<float> expert_input(const ModelConfig& c, const HostExpert& e, const float* x, int rows, ThreadPool& pool) {
    const int I = e.down.in, H = e.gate_up.in;
    const float* bias = e.gate_up.bias.empty() ? nullptr : e.gate_up.bias.data();
    std::vector<float> g(static_cast<size_t>(rows) * I), u(g.size());
    cpu::matmul(x, rows, H, e.gate_up.parts[0].dense, bias, g.data(), pool);
    cpu::matmul(x, rows, H, e.gate_up.parts[1].dense, bias ? bias + I : nullptr, u.data(), pool);
    apply_glu(c, g.data(), u.data(), rows, I);
    return g;
}

}  // namespace

Status layer_forward(const ModelConfig& c, const HostWeights& w, int li, Calib& cs, LayerHessians* hs,
                     ThreadPool& pool) {
    if (!hs) return layer_forward_to(c, w, li, cs, nullptr, pool);
    const HessianSink sink = [&](LinearInput input, int expert, const float* x, int rows, int cols) {
        const auto t0 = std::chrono::steady_clock::now();
        hs->at(input, expert).add(x, rows, cols, pool);
        hs->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    return layer_forward_to(c, w, li, cs, &sink, pool);
}

Status layer_forward_to(const ModelConfig& c, const HostWeights& w, int li, Calib& cs, const HessianSink* sink,
                        ThreadPool& pool) {
    // One page a row, of one layer: the attention reads back exactly what it stored (fp32).
    HostKvPages kv(1, cs.cols, c.num_kv_heads, c.head_dim);
    kv.grow(cs.rows);
    std::vector<Sequence::Impl> seq(static_cast<size_t>(cs.rows));
    std::vector<Sequence::Impl*> seqs;
    for (int r = 0; r < cs.rows; ++r) {
        seq[static_cast<size_t>(r)].pages = {r};
        seqs.push_back(&seq[static_cast<size_t>(r)]);
    }
    StepPlan plan = calibration_plan(cs);
    // A linear-attention layer: each row starts from a zero state of its own (one slot a row, of this layer).
    std::vector<int> recurrent(static_cast<size_t>(c.num_layers), -1);
    recurrent[static_cast<size_t>(li)] = 0;
    HostStates states(recurrent, c.is_linear(li) ? c.lin_conv_floats() + c.lin_state_floats() : 0);
    if (c.is_linear(li)) {
        states.grow(cs.rows);
        for (int r = 0; r < cs.rows; ++r) {
            plan.state_slot.push_back(r);
            plan.state_zero.push_back(1);
        }
    }
    CpuOps ops(c, w, pool, kv, seqs, li);
    ops.set_states(&states);
    if (sink)
        ops.set_capture([&](int, LinearInput input, const float* x, int rows, int cols) {
            (*sink)(input, -1, x, rows, cols);
            if (input != LinearInput::kMlpIn || !c.is_moe(li)) return;
            const HostMoe& m = w.layers[static_cast<size_t>(li)].moe;
            for (size_t e = 0; e < m.experts.size(); ++e) {
                const std::vector<float> g = expert_input(c, m.experts[e], x, rows, pool);
                (*sink)(LinearInput::kDownIn, static_cast<int>(e), g.data(), rows, m.experts[e].down.in);
            }
            if (!m.shared.gate_up.parts.empty()) {
                const std::vector<float> g = expert_input(c, m.shared, x, rows, pool);
                (*sink)(LinearInput::kDownIn, kSharedExpert, g.data(), rows, m.shared.down.in);
            }
        });
    EXL3_RETURN_IF_ERROR(ops.begin_step(plan));
    ops.residual().swap(cs.h);
    const Status s = decoder_layers(ops, c, li, li + 1);
    ops.residual().swap(cs.h);
    EXL3_RETURN_IF_ERROR(s);

    return check_state(c, li, cs, sink != nullptr);
}

Status layer_forward_pair(const ModelConfig& c, const HostWeights& w, int li, Calib& co, Calib& cs,
                          const PairSink& sink, ThreadPool& pool) {
    // co's inputs in capture order, matched to cs's by input and occurrence.
    std::vector<std::pair<LinearInput, std::vector<float>>> kept;
    const HessianSink keep = [&](LinearInput input, int expert, const float* x, int rows, int cols) {
        if (expert == -1) kept.emplace_back(input, std::vector<float>(x, x + static_cast<size_t>(rows) * cols));
    };
    EXL3_RETURN_IF_ERROR(layer_forward_to(c, w, li, co, &keep, pool));
    std::vector<size_t> used(kept.size(), 0);
    const HessianSink pair = [&](LinearInput input, int expert, const float* x, int rows, int cols) {
        const float* xo = nullptr;
        if (expert == -1)
            for (size_t k = 0; k < kept.size(); ++k)
                if (!used[k] && kept[k].first == input && kept[k].second.size() == static_cast<size_t>(rows) * cols) {
                    used[k] = 1;
                    xo = kept[k].second.data();
                    break;
                }
        sink(input, expert, xo, x, rows, cols);
    };
    return layer_forward_to(c, w, li, cs, &pair, pool);
}

Status check_state(const ModelConfig& c, int li, const Calib& cs, bool warn) {
    const int T = cs.rows * cs.cols, D = c.hidden_size;
    int bad_rows = 0;  // token positions whose state went NaN/inf: left out of every later Hessian
    for (int t = 0; t < T; ++t) {
        const float* r = cs.h.data() + static_cast<size_t>(t) * D;
        for (int i = 0; i < D; ++i)
            if (!std::isfinite(r[i])) {
                ++bad_rows;
                break;
            }
    }
    if (bad_rows == T)
        return invalid_argument(fmt::format("layer {}: every calibration activation is NaN/inf; the weights (or the "
                                            "quantization of earlier layers) overflow",
                                            li));
    if (bad_rows > 0 && warn)
        fmt::print(stderr,
                   "exl3 convert: warning: layer {}: {} of {} calibration positions hold NaN/inf activations; they are "
                   "left out of the Hessians\n",
                   li, bad_rows, T);
    return Status::ok();
}

}  // namespace exl3::convert
