#include "models/batched_experts.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "format/mxfp4.h"

namespace exl3 {

namespace {

const std::vector<DType> kFloat = {DType::kBF16, DType::kF16, DType::kF32};

// A new owned dense part [out, in] of dtype dt; its bytes at *bytes.
HostPart owned_part(std::vector<std::vector<uint8_t>>* owned, DType dt, int64_t out, int64_t in, uint8_t** bytes) {
    owned->emplace_back(static_cast<size_t>(out * in) * dtype_size(dt));
    *bytes = owned->back().data();
    return HostPart{TensorView{*bytes, dt, {out, in}}, nullptr, static_cast<int>(out)};
}

// A batch of biases [E, n] as fp32, refused when not finite.
Result<std::vector<float>> biases(const TensorStore& st, const std::string& name, int64_t E, int64_t n) {
    EXL3_ASSIGN_OR_RETURN(TensorView t, st.get(name, {E, n}, kFloat));
    const auto* p = static_cast<const uint8_t*>(t.data);
    std::vector<uint8_t> bytes(p, p + t.nbytes());  // aligned: the file offset may not be
    t.data = bytes.data();
    std::vector<float> v(static_cast<size_t>(E * n));
    cpu::to_f32(t, v.data());
    for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]))
            return invalid_argument(fmt::format("{}: tensor '{}' holds NaN or inf (expert {})", st.file_of(name), name,
                                                static_cast<int64_t>(i) / n));
    return v;
}

template <typename T>
T load(const uint8_t* base, int64_t i) {
    T v;
    std::memcpy(&v, base + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
}

// Expert e of transformers' float layout, transposed to [out, in] and de-interleaved, element for element.
template <typename T>
void split_float(const uint8_t* gu, const uint8_t* dn, int64_t e, int64_t H, int64_t W,
                 const std::array<uint8_t*, 3>& dst) {
    T* gate = reinterpret_cast<T*>(dst[0]);
    T* up = reinterpret_cast<T*>(dst[1]);
    T* down = reinterpret_cast<T*>(dst[2]);
    const uint8_t* g0 = gu + e * H * 2 * W * static_cast<int64_t>(sizeof(T));
    for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < W; ++j) {
            gate[j * H + h] = load<T>(g0, h * 2 * W + 2 * j);
            up[j * H + h] = load<T>(g0, h * 2 * W + 2 * j + 1);
        }
    const uint8_t* d0 = dn + e * W * H * static_cast<int64_t>(sizeof(T));
    for (int64_t i = 0; i < W; ++i)
        for (int64_t h = 0; h < H; ++h) down[h * W + i] = load<T>(d0, i * H + h);
}

// Row `row` of an MXFP4 batch tensor (n values a row) into bf16 `out`; "" or what is wrong with it.
std::string mxfp4_row(const TensorView& blocks, const TensorView& scales, int64_t row, int64_t n, float* tmp,
                      uint16_t* out) {
    const int64_t nb = n / mxfp4::kBlockValues;
    const auto* b = static_cast<const uint8_t*>(blocks.data) + row * nb * mxfp4::kBlockBytes;
    const auto* s = static_cast<const uint8_t*>(scales.data) + row * nb;
    const int64_t bad = mxfp4::decode(b, s, n, tmp);
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(tmp[i]);
    if (bad < 0) return {};
    return fmt::format(
        "column {}: scale byte {} makes a value that is not finite (255 is NaN; 2^(s - 127) x 6 "
        "must stay within fp32)",
        bad, s[bad / mxfp4::kBlockValues]);
}

// Expert e of the Hub's MXFP4 layout: rows 2j / 2j + 1 of gate_up to gate / up row j; down's rows as they are.
std::string split_mxfp4(const TensorStore& st, const TensorView* t, int64_t e, int64_t H, int64_t W,
                        const std::array<uint8_t*, 3>& dst, const std::string& gu_name, const std::string& dn_name) {
    std::vector<float> tmp(static_cast<size_t>(std::max(H, W)));
    auto* gate = reinterpret_cast<uint16_t*>(dst[0]);
    auto* up = reinterpret_cast<uint16_t*>(dst[1]);
    auto* down = reinterpret_cast<uint16_t*>(dst[2]);
    for (int64_t r = 0; r < 2 * W; ++r) {
        uint16_t* o = (r % 2 ? up : gate) + (r / 2) * H;
        const std::string err = mxfp4_row(t[0], t[1], e * 2 * W + r, H, tmp.data(), o);
        if (!err.empty())
            return fmt::format("{}: tensor '{}' (expert {}, row {}) {}", st.file_of(gu_name), gu_name, e, r, err);
    }
    for (int64_t h = 0; h < H; ++h) {
        const std::string err = mxfp4_row(t[2], t[3], e * H + h, W, tmp.data(), down + h * W);
        if (!err.empty())
            return fmt::format("{}: tensor '{}' (expert {}, row {}) {}", st.file_of(dn_name), dn_name, e, h, err);
    }
    return {};
}

}  // namespace

bool has_batched_experts(const TensorStore& store, const std::string& prefix) {
    return store.contains(prefix + "gate_up_proj") || store.contains(prefix + "gate_up_proj_blocks");
}

Status load_batched_experts(const TensorStore& store, const std::string& prefix, int experts, int hidden, int width,
                            ThreadPool* pool, std::vector<std::vector<uint8_t>>* owned, std::vector<HostExpert>* out) {
    const int64_t E = experts, H = hidden, W = width;
    const bool mx = store.contains(prefix + "gate_up_proj_blocks");
    const std::string gu_name = prefix + (mx ? "gate_up_proj_blocks" : "gate_up_proj");
    const std::string dn_name = prefix + (mx ? "down_proj_blocks" : "down_proj");
    TensorView t[4];  // gate_up, its scales, down, its scales (MXFP4); gate_up, -, down, - (float)
    if (mx) {
        if (H % mxfp4::kBlockValues || W % mxfp4::kBlockValues)
            return invalid_argument(
                fmt::format("{}: MXFP4 experts need hidden_size {} and intermediate_size {} to be "
                            "multiples of 32",
                            store.file_of(gu_name), H, W));
        const std::vector<DType> u8 = {DType::kU8};
        EXL3_ASSIGN_OR_RETURN(t[0], store.get(gu_name, {E, 2 * W, H / 32, mxfp4::kBlockBytes}, u8));
        EXL3_ASSIGN_OR_RETURN(t[1], store.get(prefix + "gate_up_proj_scales", {E, 2 * W, H / 32}, u8));
        EXL3_ASSIGN_OR_RETURN(t[2], store.get(dn_name, {E, H, W / 32, mxfp4::kBlockBytes}, u8));
        EXL3_ASSIGN_OR_RETURN(t[3], store.get(prefix + "down_proj_scales", {E, H, W / 32}, u8));
    } else {
        EXL3_ASSIGN_OR_RETURN(t[0], store.get(gu_name, {E, H, 2 * W}, kFloat));
        EXL3_ASSIGN_OR_RETURN(t[2], store.get(dn_name, {E, W, H}, kFloat));
        if (t[0].dtype != t[2].dtype)
            return invalid_argument(fmt::format("{}: '{}' is {} but '{}' is {}", store.file_of(dn_name), gu_name,
                                                dtype_name(t[0].dtype), dn_name, dtype_name(t[2].dtype)));
    }
    EXL3_ASSIGN_OR_RETURN(std::vector<float> gub, biases(store, prefix + "gate_up_proj_bias", E, 2 * W));
    EXL3_ASSIGN_OR_RETURN(std::vector<float> dnb, biases(store, prefix + "down_proj_bias", E, H));
    const DType dt = mx ? DType::kBF16 : t[0].dtype;
    out->assign(static_cast<size_t>(E), HostExpert{});
    std::vector<std::array<uint8_t*, 3>> dst(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
        HostExpert& x = (*out)[static_cast<size_t>(e)];
        auto& d = dst[static_cast<size_t>(e)];
        x.gate_up.parts = {owned_part(owned, dt, W, H, &d[0]), owned_part(owned, dt, W, H, &d[1])};
        x.gate_up.in = static_cast<int>(H);
        x.gate_up.out = static_cast<int>(2 * W);
        const float* b = gub.data() + e * 2 * W;
        for (int half = 0; half < 2; ++half)  // gate's biases, then up's: the parts' columns
            for (int64_t j = 0; j < W; ++j) x.gate_up.bias.push_back(b[2 * j + half]);
        x.down.parts = {owned_part(owned, dt, H, W, &d[2])};
        x.down.in = static_cast<int>(W);
        x.down.out = static_cast<int>(H);
        x.down.bias.assign(dnb.begin() + e * H, dnb.begin() + (e + 1) * H);
    }
    std::vector<std::string> errs(static_cast<size_t>(E));
    auto fill = [&](size_t e0, size_t e1) {
        const auto* gu = static_cast<const uint8_t*>(t[0].data);
        const auto* dn = static_cast<const uint8_t*>(t[2].data);
        for (size_t e = e0; e < e1; ++e) {
            const int64_t ei = static_cast<int64_t>(e);
            if (mx)
                errs[e] = split_mxfp4(store, t, ei, H, W, dst[e], gu_name, dn_name);
            else if (dt == DType::kF32)
                split_float<float>(gu, dn, ei, H, W, dst[e]);
            else
                split_float<uint16_t>(gu, dn, ei, H, W, dst[e]);
        }
    };
    if (pool)
        pool->parallel_for(static_cast<size_t>(E), 1, fill);
    else
        fill(0, static_cast<size_t>(E));
    for (const std::string& err : errs)
        if (!err.empty()) return invalid_argument(err);
    return Status::ok();
}

}  // namespace exl3
