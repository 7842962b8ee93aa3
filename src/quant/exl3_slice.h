// Slices of one EXL3 linear for tensor parallelism (models/sharding.h): a rank keeps some output columns (q/k/v,
// gate/up, the head: a column split, outputs concatenated across ranks) or some input rows (o, down: a row split,
// partial outputs summed across ranks), read from the same files, never re-converted.
//
// Why 128: W_eff = diag(suh) . Hk . W^ . Hn . diag(svh) with Hk, Hn block-diagonal over 128-point Hadamard blocks
// (exl3-format.md). Output columns [c0, c1) with c0, c1 on block edges depend on the tiles of those columns only:
// y[:, c0:c1] = ((xh . W^[:, c0:c1]) . Hn') * svh[c0:c1], Hn' the same blocks. Input rows on block edges likewise:
// xh's blocks are independent, so y = sum over row ranges of ((x[:, r0:r1] * suh[r0:r1]) . Hk' . W^[r0:r1, :]) . Hn
// * svh -- a row split's partial outputs add up to the whole (bias aside: one rank keeps it). A slice off the block
// edges cannot be computed from whole tiles alone; exl3_slice_dense gives it as a dense fp32 weight instead.
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/status.h"
#include "quant/exl3_linear.h"

namespace exl3::quant {

// Whether [begin, end) of a dimension of `features` lies on 128-blocks: begin a multiple of 128, and end a multiple
// of 128 or the dimension's end (its last block is zero-padded).
bool exl3_slice_aligned(int begin, int end, int features);

// Output columns [c0, c1) of `l` (aligned): their tiles copied into *storage (the result's trellis points there;
// keep it alive and unmoved), svh sliced, suh whole. Bias sliced when `l` carries one.
Result<Exl3Linear> exl3_slice_columns(const Exl3Linear& l, int c0, int c1, std::vector<uint8_t>* storage);

// Input rows [r0, r1) of `l` (aligned): the trellis points into l's (rows of tiles are contiguous), suh sliced, svh
// whole. The bias is dropped: a row split's partial outputs are summed, and one rank adds the bias.
Result<Exl3Linear> exl3_slice_rows(const Exl3Linear& l, int r0, int r1);

// The dense HF weight [c1 - c0, r1 - r0] (fp32, row-major) of output columns [c0, c1) and input rows [r0, r1) of
// W_eff, for slices off the block edges: only the blocks that cover the slice are decoded.
Result<std::vector<float>> exl3_slice_dense(const Exl3Linear& l, int c0, int c1, int r0, int r1);

}  // namespace exl3::quant
