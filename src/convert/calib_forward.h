// The converter's calibration forward: the calibration rows through the model one decoder layer at a time, on the
// CPU backend's ops and through the one decoder (models/decoder.h: decoder_layers), with a capture hook that adds
// each linear's input to that linear's Hessian. The weights are the converter's own fp32 copies, so the layers
// already quantized run with their reconstruction (what the reader will compute).
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "exl3/status.h"
#include "format/model_config.h"
#include "models/weights.h"

namespace exl3::convert {

// H [d, d] (upper and lower halves) += x^T x over the finite rows of the inputs; rows counts them.
struct Hess {
    std::vector<double> h;
    int64_t rows = 0;
    void add(const float* x, int T, int d, ThreadPool& pool);
};

// A layer's Hessians by input: q/k/v share the attention input's, gate/up the MLP input's. In a mixture of experts
// every expert's gate and up (and the shared expert's) take the MLP input's over all calibration rows, and each
// expert's down the Hessian of its own intermediate act(x Wg^T) * (x Wu^T) over all rows too, as if every row had
// chosen it (the reference implementation's rule): an expert that the router gives few or no calibration rows still
// gets a full Hessian from the layer's real inputs. The state itself moves on through the real routing.
struct LayerHessians {
    Hess qkv, o, gu, down;
    std::vector<Hess> expert_down;  // [experts], MoE layers
    Hess shared_down;
};

// The calibration state: `rows` sequences of `cols` tokens, residual stream h [rows * cols, hidden].
struct Calib {
    int rows = 0, cols = 0;
    std::vector<float> h;
};

// Runs layer `li` of `w` over the state (which then holds the layer's output), adding each linear's input to `hs`
// when given. Fails when every calibration position turned NaN/inf; warns (once per layer, with `hs`) when some did.
Status layer_forward(const ModelConfig& c, const HostWeights& w, int li, Calib& cs, LayerHessians* hs,
                     ThreadPool& pool);

}  // namespace exl3::convert
