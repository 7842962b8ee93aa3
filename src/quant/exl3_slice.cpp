#include "quant/exl3_slice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace exl3::quant {

namespace {

Status check_range(const Exl3Linear& l, const char* what, int begin, int end, int features) {
    if (begin < 0 || end > features || begin >= end)
        return invalid_argument(
            fmt::format("EXL3 layer '{}': {} [{}, {}) outside [0, {})", l.name, what, begin, end, features));
    return Status::ok();
}

Status check_aligned(const Exl3Linear& l, const char* what, int begin, int end, int features) {
    EXL3_RETURN_IF_ERROR(check_range(l, what, begin, end, features));
    if (!exl3_slice_aligned(begin, end, features))
        return invalid_argument(fmt::format(
            "EXL3 layer '{}': {} [{}, {}) do not lie on the 128-wide Hadamard blocks (the tiles of a slice must "
            "cover it exactly)",
            l.name, what, begin, end));
    return Status::ok();
}

}  // namespace

bool exl3_slice_aligned(int begin, int end, int features) {
    return begin % 128 == 0 && (end % 128 == 0 || end == features);
}

Result<Exl3Linear> exl3_slice_columns(const Exl3Linear& l, int c0, int c1, std::vector<uint8_t>* storage) {
    EXL3_RETURN_IF_ERROR(check_aligned(l, "output columns", c0, c1, l.out_features));
    Exl3Linear s;
    s.name = fmt::format("{} [columns {}:{}]", l.name, c0, c1);
    s.in_features = l.in_features;
    s.out_features = c1 - c0;
    s.k_pad = l.k_pad;
    s.n_pad = pad128(s.out_features);
    s.K = l.K;
    s.codebook = l.codebook;
    const size_t tile_words = static_cast<size_t>(16 * l.K), k_tiles = static_cast<size_t>(l.k_pad / 16);
    const size_t n_tiles = static_cast<size_t>(s.n_pad / 16), tn0 = static_cast<size_t>(c0 / 16);
    storage->assign(k_tiles * n_tiles * tile_words * sizeof(uint16_t), 0);
    auto* dst = reinterpret_cast<uint16_t*>(storage->data());
    for (size_t tk = 0; tk < k_tiles; ++tk)  // one row of tiles: n_tiles of them side by side, contiguous
        std::memcpy(dst + tk * n_tiles * tile_words, l.tile(static_cast<int>(tk), static_cast<int>(tn0)),
                    n_tiles * tile_words * sizeof(uint16_t));
    s.trellis = dst;
    s.suh = l.suh;
    s.svh.assign(l.svh.begin() + c0, l.svh.begin() + c0 + s.n_pad);
    if (!l.bias.empty()) s.bias.assign(l.bias.begin() + c0, l.bias.begin() + c1);
    return s;
}

Result<Exl3Linear> exl3_slice_rows(const Exl3Linear& l, int r0, int r1) {
    EXL3_RETURN_IF_ERROR(check_aligned(l, "input rows", r0, r1, l.in_features));
    Exl3Linear s;
    s.name = fmt::format("{} [rows {}:{}]", l.name, r0, r1);
    s.in_features = r1 - r0;
    s.out_features = l.out_features;
    s.k_pad = pad128(s.in_features);
    s.n_pad = l.n_pad;
    s.K = l.K;
    s.codebook = l.codebook;
    s.trellis = l.tile(r0 / 16, 0);
    s.suh.assign(l.suh.begin() + r0, l.suh.begin() + r0 + s.k_pad);
    s.svh = l.svh;
    return s;
}

Result<std::vector<float>> exl3_slice_dense(const Exl3Linear& l, int c0, int c1, int r0, int r1) {
    EXL3_RETURN_IF_ERROR(check_range(l, "output columns", c0, c1, l.out_features));
    EXL3_RETURN_IF_ERROR(check_range(l, "input rows", r0, r1, l.in_features));
    // The blocks that cover the slice, as an aligned slice of their own, decoded whole; then the slice cut out.
    const int bc0 = c0 / 128 * 128, bc1 = std::min(pad128(c1), l.out_features);
    const int br0 = r0 / 128 * 128, br1 = std::min(pad128(r1), l.in_features);
    std::vector<uint8_t> storage;
    EXL3_ASSIGN_OR_RETURN(Exl3Linear cols, exl3_slice_columns(l, bc0, bc1, &storage));
    EXL3_ASSIGN_OR_RETURN(Exl3Linear block, exl3_slice_rows(cols, br0, br1));
    std::vector<float> w(static_cast<size_t>(block.out_features) * static_cast<size_t>(block.in_features));
    exl3_dequantize(block, w.data());
    const size_t rows = static_cast<size_t>(c1 - c0), cols_n = static_cast<size_t>(r1 - r0);
    std::vector<float> out(rows * cols_n);
    for (size_t c = 0; c < rows; ++c)
        std::memcpy(out.data() + c * cols_n,
                    w.data() + (static_cast<size_t>(c0 - bc0) + c) * static_cast<size_t>(block.in_features) +
                        static_cast<size_t>(r0 - br0),
                    cols_n * sizeof(float));
    return out;
}

}  // namespace exl3::quant
