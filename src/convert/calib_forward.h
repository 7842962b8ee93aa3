// The converter's calibration forward: the calibration rows through the model one decoder layer at a time, on the
// CPU backend's ops and through the one decoder (models/decoder.h: decoder_layers), with a capture hook that adds
// each linear's input to that linear's Hessian. The weights are the converter's own fp32 copies, so the layers
// already quantized run with their reconstruction (what the reader will compute).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "format/model_config.h"
#include "models/decoder.h"
#include "models/weights.h"

namespace exl3::convert {

// H [d, d] (upper and lower halves) += x^T x over the finite rows of the inputs; rows counts them.
struct Hess {
    std::vector<double> h;
    int64_t rows = 0;
    void add(const float* x, int T, int d, ThreadPool& pool);
    // The asymmetric calibration's shift instead (ConvertRecipe::asym, quant/asym.h): h [d, d] += (xo - x)^T x over
    // the rows finite in both, xo the unquantized model's input at the positions of x (the quantized path's).
    void add_shift(const float* xo, const float* x, int T, int d, ThreadPool& pool);
};

// Receives each captured linear input x [rows, cols] (fp32): which input, and for the down projections of a mixture
// of experts which expert (>= 0, or kSharedExpert; -1 for every other input).
using HessianSink = std::function<void(LinearInput input, int expert, const float* x, int rows, int cols)>;
constexpr int kSharedExpert = -2;

// Whose input a linear reads, for its Hessian: the attention's (q, k, v; a linear-attention layer's input
// projections), the output projection's, the MLP's (gate, up, every expert's), a down projection's.
enum class HessOf { kAttnIn, kOIn, kMlpIn, kDown, kExpertDown, kSharedDown };

// A layer's Hessians by input: q/k/v share the attention input's, gate/up the MLP input's. In a mixture of experts
// every expert's gate and up (and the shared expert's) take the MLP input's over all calibration rows, and each
// expert's down the Hessian of its own intermediate act(x Wg^T) * (x Wu^T) over all rows too, as if every row had
// chosen it (the reference implementation's rule): an expert that the router gives few or no calibration rows still
// gets a full Hessian from the layer's real inputs. The state itself moves on through the real routing.
// H: Hess on the host; the CUDA converter keeps them on the GPU.
template <class H>
struct LayerHessiansOf {
    H qkv, o, gu, down;
    std::vector<H> expert_down;  // [experts], MoE layers
    H shared_down;
    double seconds = 0;  // wall time spent adding to them (inside layer_forward)
    H& at(LinearInput input, int expert) {
        if (input == LinearInput::kAttnIn) return qkv;
        if (input == LinearInput::kOIn) return o;
        if (input == LinearInput::kMlpIn) return gu;
        if (expert == kSharedExpert) return shared_down;
        if (expert < 0) return down;
        if (expert_down.size() <= static_cast<size_t>(expert)) expert_down.resize(static_cast<size_t>(expert) + 1);
        return expert_down[static_cast<size_t>(expert)];
    }
    // The Hessian a linear reads (Lin::src; `expert` for kExpertDown, one past the experts: the shared expert's).
    const H& of_linear(HessOf src, int expert) const {
        switch (src) {
            case HessOf::kAttnIn: return qkv;
            case HessOf::kOIn: return o;
            case HessOf::kMlpIn: return gu;
            case HessOf::kDown: return down;
            case HessOf::kExpertDown:
                return static_cast<size_t>(expert) < expert_down.size() ? expert_down[static_cast<size_t>(expert)]
                                                                        : shared_down;
            case HessOf::kSharedDown: return shared_down;
        }
        return qkv;
    }
};
using LayerHessians = LayerHessiansOf<Hess>;

// The calibration state: `rows` sequences of `cols` tokens, residual stream h [rows * cols, hidden].
struct Calib {
    int rows = 0, cols = 0;
    std::vector<float> h;
};

// Runs layer `li` of `w` over the state (which then holds the layer's output), handing each linear's input to the
// sink when given. Fails when every calibration position turned NaN/inf; warns (once per layer, with a sink) when
// some did.
Status layer_forward_to(const ModelConfig& c, const HostWeights& w, int li, Calib& cs, const HessianSink* sink,
                        ThreadPool& pool);
// The asymmetric calibration (ConvertRecipe::asym): layer li over `co`, the unquantized model's state (which then
// holds the layer's output), and over `cs`, the quantized path's (which then holds it too), handing the sink each
// linear input of cs with the input co gives the same linear at the same positions (xo; null for every expert's down
// input, which takes no shift).
using PairSink = std::function<void(LinearInput input, int expert, const float* xo, const float* x, int rows, int cols)>;
Status layer_forward_pair(const ModelConfig& c, const HostWeights& w, int li, Calib& co, Calib& cs,
                          const PairSink& sink, ThreadPool& pool);
// After a layer: fails when every position of the state is NaN/inf, warns (when asked) when some are.
Status check_state(const ModelConfig& c, int li, const Calib& cs, bool warn);
// The same adding to host Hessians (hs may be null).
Status layer_forward(const ModelConfig& c, const HostWeights& w, int li, Calib& cs, LayerHessians* hs,
                     ThreadPool& pool);

}  // namespace exl3::convert
