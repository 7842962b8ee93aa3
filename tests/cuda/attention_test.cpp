// Paged attention (prefill, decode, mixed) and kv_append against cpu::attention on random data.
//
// Each case builds a batch of sequences of different lengths whose pages are scattered over a shuffled pool, writes
// the old tokens' K/V straight into the pages from the host and the new tokens' through kv_append, poisons the
// output, runs attention and compares every value with cpu::attention run per sequence on its K/V gathered into a
// contiguous fp32 cache (the same rounded bf16/fp16 values the GPU reads).
//
// Quantized cases (k_bits / v_bits 4, 6, 8): the old tokens are quantized on the host by kv::kv_quantize and laid
// out as the GPU stores them (codes, then parameters: paged_attention.cuh); kv_append must write the new tokens'
// codes and parameters bit-identical to kv::kv_quantize of the same 16-bit inputs; the reference attention runs on
// kv::kv_dequantize of those records, so the GPU's in-kernel dequantization is checked against the CPU codec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kv/kv_codec.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/attention/paged_attention.cuh"
#include "backend/cuda/exl3/exl3_matmul.cuh"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace exl3 {
namespace {

using cuda::AttnDType;

uint16_t to_bits(float f, AttnDType dt) { return dt == AttnDType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f); }
float from_bits(uint16_t h, AttnDType dt) { return dt == AttnDType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); }

struct Seq {
    int len;    // tokens in the cache after the step
    int q_len;  // new tokens this step
};

struct Case {
    std::string name;
    AttnDType dtype;
    int head_dim, n_heads, n_kv_heads, page_size, window;
    std::vector<Seq> seqs;
    int k_bits = 0, v_bits = 0;  // KV-cache quantization of each side (0: 16-bit)
    float softcap = 0.0f;        // Gemma 2's score soft-cap (0: none)
    bool sinks = false;          // gpt-oss's per-head sink logits (random, some above every score)
};

// One side of a quantized pool in the GPU layout: codes [slots, code_bytes], then params [slots, head_dim / 32] x 4
// bytes, slot = (page * page_size + pos) * n_kv_heads + head. Records are the CPU's (kv::kv_quantize).
struct QuantPool {
    int bits = 0, head_dim = 0;
    size_t slots = 0, code_bytes = 0, params_off = 0;
    std::vector<uint8_t> bytes;

    QuantPool() = default;
    QuantPool(int b, int d, size_t n_slots, std::mt19937& rng) : bits(b), head_dim(d), slots(n_slots) {
        code_bytes = cuda::kv_code_bytes(d, b);
        params_off = slots * code_bytes;
        bytes.resize(slots * cuda::kv_vector_bytes(d, b));
        for (auto& x : bytes) x = static_cast<uint8_t>(rng());  // garbage (NaN parameters too): must not be read
    }
    kv::KvQuantFormat format() const { return kv::kv_cache_format(bits); }
    size_t group_code_bytes() const { return static_cast<size_t>(cuda::kKvGroup) * bits / 8; }
    void put(size_t slot, const uint8_t* rec) {
        for (int g = 0; g < head_dim / cuda::kKvGroup; ++g) {
            const uint8_t* r = rec + g * (4 + group_code_bytes());
            std::copy(r, r + 4, bytes.begin() + static_cast<long>(params_off + slot * (head_dim / 8) + g * 4));
            std::copy(r + 4, r + 4 + group_code_bytes(),
                      bytes.begin() + static_cast<long>(slot * code_bytes + g * group_code_bytes()));
        }
    }
    std::vector<uint8_t> get(size_t slot) const {
        std::vector<uint8_t> rec(kv::kv_quant_bytes(format(), head_dim));
        for (int g = 0; g < head_dim / cuda::kKvGroup; ++g) {
            uint8_t* r = rec.data() + g * (4 + group_code_bytes());
            const auto p = bytes.begin() + static_cast<long>(params_off + slot * (head_dim / 8) + g * 4);
            std::copy(p, p + 4, r);
            const auto c = bytes.begin() + static_cast<long>(slot * code_bytes + g * group_code_bytes());
            std::copy(c, c + static_cast<long>(group_code_bytes()), r + 4);
        }
        return rec;
    }
    // Quantizes x [head_dim] into slot and returns the dequantized values in x.
    void quantize_into(size_t slot, float* x) {
        std::vector<uint8_t> rec(kv::kv_quant_bytes(format(), head_dim));
        kv::kv_quantize(format(), x, head_dim, rec.data());
        kv::kv_dequantize(format(), rec.data(), head_dim, x);
        put(slot, rec.data());
    }
};

// Codes that differ between two pools of the same layout, and the largest difference of one code.
struct CodeDiff {
    size_t codes = 0, params = 0;
    int max_code_delta = 0;
};
CodeDiff code_diff(const QuantPool& a, const QuantPool& b) {
    CodeDiff d;
    const uint32_t mask = (1u << a.bits) - 1;
    for (size_t s = 0; s < a.slots; ++s) {
        for (int i = 0; i < a.head_dim; ++i) {
            const size_t bit = static_cast<size_t>(i) * a.bits;
            auto code = [&](const QuantPool& p) {
                const uint8_t* c = p.bytes.data() + s * p.code_bytes + bit / 8;
                const uint32_t w = c[0] | (bit / 8 + 1 < p.code_bytes ? c[1] << 8 : 0);
                return static_cast<int>((w >> (bit % 8)) & mask);
            };
            const int delta = std::abs(code(a) - code(b));
            d.codes += delta != 0;
            d.max_code_delta = std::max(d.max_code_delta, delta);
        }
    }
    for (size_t i = a.params_off; i < a.bytes.size(); i += 2)
        d.params += a.bytes[i] != b.bytes[i] || a.bytes[i + 1] != b.bytes[i + 1];
    return d;
}

using test::DevBuf;

// Host-side model of one step: the page pool, the plan arrays, and the inputs in both 16-bit and rounded fp32 form.
struct Step {
    const Case& c;
    int batch = 0, total_q = 0, max_q_len = 0, max_seq_len = 0, max_pages = 0, num_pages = 0;
    std::vector<int32_t> q_start, seq_len, page_table;
    std::vector<uint16_t> k_pages, v_pages;     // [num_pages, page_size, n_kv, D]
    QuantPool kq, vq, kq_after, vq_after;       // quantized sides: before and after kv_append
    std::vector<uint16_t> q_bits, kn_bits, vn_bits;
    std::vector<float> q_f;                     // rounded q
    std::vector<float> sinks;                   // [n_heads] when the case has sinks
    std::vector<std::vector<float>> k_seq, v_seq;  // per sequence [len, n_kv, D] (rounded), new tokens included

    Step(const Case& cs, uint32_t seed) : c(cs) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.f, 1.f);
        batch = static_cast<int>(c.seqs.size());
        q_start.push_back(0);
        for (const auto& s : c.seqs) {
            q_start.push_back(q_start.back() + s.q_len);
            seq_len.push_back(s.len);
            max_q_len = std::max(max_q_len, s.q_len);
            max_seq_len = std::max(max_seq_len, s.len);
            max_pages = std::max(max_pages, (s.len + c.page_size - 1) / c.page_size);
        }
        total_q = q_start.back();
        // A pool with spare pages, handed out in shuffled order so no sequence's pages are contiguous.
        int needed = 0;
        for (const auto& s : c.seqs) needed += (s.len + c.page_size - 1) / c.page_size;
        num_pages = needed + 3;
        std::vector<int32_t> pool(static_cast<size_t>(num_pages));
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng);
        page_table.assign(static_cast<size_t>(batch) * max_pages, -1);  // unused slots: never read
        size_t next = 0;
        for (int b = 0; b < batch; ++b)
            for (int i = 0; i < (c.seqs[b].len + c.page_size - 1) / c.page_size; ++i)
                page_table[static_cast<size_t>(b) * max_pages + i] = pool[next++];

        const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
        const size_t pool_elems = static_cast<size_t>(num_pages) * c.page_size * row;
        k_pages.resize(pool_elems);
        v_pages.resize(pool_elems);
        for (size_t i = 0; i < pool_elems; ++i) {  // garbage everywhere first: unread slots must not matter
            k_pages[i] = to_bits(nd(rng) * 100.f, c.dtype);
            v_pages[i] = to_bits(nd(rng) * 100.f, c.dtype);
        }
        const size_t slots = static_cast<size_t>(num_pages) * c.page_size * c.n_kv_heads;
        if (c.k_bits) kq = QuantPool(c.k_bits, c.head_dim, slots, rng);
        if (c.v_bits) vq = QuantPool(c.v_bits, c.head_dim, slots, rng);
        kq_after = kq;
        vq_after = vq;
        kn_bits.resize(static_cast<size_t>(total_q) * row);
        vn_bits.resize(kn_bits.size());
        for (int b = 0; b < batch; ++b) {
            const auto& s = c.seqs[b];
            std::vector<float> ks(static_cast<size_t>(s.len) * row), vs(ks.size());
            for (int pos = 0; pos < s.len; ++pos) {
                const bool is_new = pos >= s.len - s.q_len;
                const int page = page_table[static_cast<size_t>(b) * max_pages + pos / c.page_size];
                const size_t dst = (static_cast<size_t>(page) * c.page_size + pos % c.page_size) * row;
                const size_t nrow = static_cast<size_t>(q_start[b] + pos - (s.len - s.q_len)) * row;
                for (size_t i = 0; i < row; ++i) {
                    const uint16_t kb = to_bits(nd(rng), c.dtype), vb = to_bits(nd(rng), c.dtype);
                    ks[pos * row + i] = from_bits(kb, c.dtype);
                    vs[pos * row + i] = from_bits(vb, c.dtype);
                    if (is_new) {
                        kn_bits[nrow + i] = kb;
                        vn_bits[nrow + i] = vb;
                    } else {
                        k_pages[dst + i] = kb;
                        v_pages[dst + i] = vb;
                    }
                }
                // Quantized sides: the reference sees the dequantized values; the pool gets the records (old
                // tokens before the append, every token after it).
                for (int h = 0; h < c.n_kv_heads; ++h) {
                    const size_t slot = dst / static_cast<size_t>(c.head_dim) + h;
                    for (auto [bits, vals, before, after] :
                         {std::tuple{c.k_bits, &ks, &kq, &kq_after}, std::tuple{c.v_bits, &vs, &vq, &vq_after}}) {
                        if (!bits) continue;
                        float* x = vals->data() + pos * row + static_cast<size_t>(h) * c.head_dim;
                        after->quantize_into(slot, x);
                        if (!is_new) before->put(slot, after->get(slot).data());
                    }
                }
            }
            k_seq.push_back(std::move(ks));
            v_seq.push_back(std::move(vs));
        }
        if (c.sinks)  // about the scores' size; every third head's well above them (the sink takes most weight)
            for (int h = 0; h < c.n_heads; ++h) sinks.push_back(2.0f * nd(rng) + (h % 3 == 2 ? 8.0f : 0.0f));
        const size_t qn = static_cast<size_t>(total_q) * c.n_heads * c.head_dim;
        q_bits.resize(qn);
        q_f.resize(qn);
        for (size_t i = 0; i < qn; ++i) {
            q_bits[i] = to_bits(nd(rng) * 1.5f, c.dtype);
            q_f[i] = from_bits(q_bits[i], c.dtype);
        }
    }

    // cpu::attention per sequence: [total_q, n_heads, D].
    std::vector<float> reference(float scale, float softcap = 0.0f) const {
        const float* sk = sinks.empty() ? nullptr : sinks.data();
        std::vector<float> out(static_cast<size_t>(total_q) * c.n_heads * c.head_dim);
        for (int b = 0; b < batch; ++b) {
            const auto& s = c.seqs[b];
            std::vector<int32_t> pos(static_cast<size_t>(s.q_len));
            for (int t = 0; t < s.q_len; ++t) pos[t] = s.len - s.q_len + t;
            const size_t off = static_cast<size_t>(q_start[b]) * c.n_heads * c.head_dim;
            cpu::attention(q_f.data() + off, s.q_len, c.n_heads, c.n_kv_heads, c.head_dim, k_seq[b].data(),
                           v_seq[b].data(), s.len, pos.data(), c.window, scale, out.data() + off,
                           ThreadPool::global(), softcap, sk);
        }
        return out;
    }
};

struct ErrStats {
    double max_abs = 0, max_ref = 0;
    size_t bad = 0;  // NaN, or never written (poison)
};

ErrStats compare(const std::vector<uint16_t>& got, const std::vector<float>& ref, AttnDType dt) {
    ErrStats e;
    for (size_t i = 0; i < ref.size(); ++i) {
        const float g = from_bits(got[i], dt);
        if (!std::isfinite(g)) {
            ++e.bad;
            continue;
        }
        e.max_abs = std::max(e.max_abs, static_cast<double>(std::fabs(g - ref[i])));
        e.max_ref = std::max(e.max_ref, static_cast<double>(std::fabs(ref[i])));
    }
    return e;
}

// Device copies of a Step and the plan that points at them.
struct DevStep {
    DevBuf<uint16_t> k, v, q, kn, vn, out;
    DevBuf<int32_t> q_start, seq_len, page_table;
    DevBuf<unsigned char> ws;
    cuda::PagedKV kv{};
    cuda::AttentionBatch plan{};
    size_t ws_bytes = 0;

    DevBuf<uint8_t> kq, vq;  // quantized sides

    explicit DevStep(const Step& s)
        : k(s.k_pages.size()), v(s.v_pages.size()), q(s.q_bits.size()), kn(s.kn_bits.size()),
          vn(s.vn_bits.size()), out(s.q_bits.size()), q_start(s.q_start.size()), seq_len(s.seq_len.size()),
          page_table(s.page_table.size()), ws(0), kq(s.kq.bytes.size()), vq(s.vq.bytes.size()) {
        kv = {k.p, v.p, s.num_pages, s.c.page_size, s.c.n_kv_heads, s.c.head_dim, s.c.dtype};
        kv.k_bits = s.c.k_bits;
        kv.v_bits = s.c.v_bits;
        if (s.c.k_bits) {
            kv.k = kq.p;
            kv.k_params = kq.p + s.kq.params_off;
        }
        if (s.c.v_bits) {
            kv.v = vq.p;
            kv.v_params = vq.p + s.vq.params_off;
        }
        plan = {s.batch, q_start.p, seq_len.p, page_table.p, s.max_pages, s.total_q, s.max_q_len, s.max_seq_len};
    }
};

#define UPLOAD(dst, vec) \
    EXL3_CUDA_OK(cudaMemcpy((dst), (vec).data(), (vec).size() * sizeof((vec)[0]), cudaMemcpyHostToDevice))
#define DOWNLOAD(vec, src) \
    EXL3_CUDA_OK(cudaMemcpy((vec).data(), (src), (vec).size() * sizeof((vec)[0]), cudaMemcpyDeviceToHost))

// The step's pool, inputs and plan arrays to the device (the new tokens' K/V go in through kv_append later).
void upload(const Step& s, DevStep& d) {
    ASSERT_NE(d.k.p, nullptr);
    UPLOAD(d.k.p, s.k_pages);
    UPLOAD(d.v.p, s.v_pages);
    UPLOAD(d.q.p, s.q_bits);
    UPLOAD(d.kn.p, s.kn_bits);
    UPLOAD(d.vn.p, s.vn_bits);
    UPLOAD(d.q_start.p, s.q_start);
    UPLOAD(d.seq_len.p, s.seq_len);
    UPLOAD(d.page_table.p, s.page_table);
    if (s.c.k_bits) UPLOAD(d.kq.p, s.kq.bytes);
    if (s.c.v_bits) UPLOAD(d.vq.p, s.vq.bytes);
}

// tuning: the plan's (the defaults unless a test forces a decode shape).
void run_case(const Case& c, uint32_t seed, const cuda::AttentionTuning& tuning = {}) {
    const Step s(c, seed);
    DevStep d(s);
    ASSERT_NO_FATAL_FAILURE(upload(s, d));

    // kv_append, then check that exactly the new rows changed and hold the new values.
    EXL3_CUDA_OK(cuda::kv_append(d.kv, d.plan, d.kn.p, d.vn.p, nullptr));
    EXL3_CUDA_OK(cudaDeviceSynchronize());
    for (auto [bits, dev, want, side] : {std::tuple{c.k_bits, d.kq.p, &s.kq_after, "K"},
                                         std::tuple{c.v_bits, d.vq.p, &s.vq_after, "V"}}) {
        if (!bits) continue;
        QuantPool got = *want;
        DOWNLOAD(got.bytes, dev);
        const CodeDiff df = code_diff(got, *want);
        std::printf("[attn] %-34s kv_append %s %d-bit: %zu codes and %zu fp16 parameters differ from "
                    "kv::kv_quantize (largest code difference %d)\n",
                    c.name.c_str(), side, bits, df.codes, df.params, df.max_code_delta);
        // Bit-identical: both sides compute min/max, the fp16 step and min, and round((x - min) / step) in IEEE
        // fp32 with the same operations on the same fp32 inputs (the 16-bit values), with no fusing on the GPU.
        EXPECT_TRUE(got.bytes == want->bytes) << c.name << ": kv_append " << side << " differs from the CPU codec";
    }
    if (c.k_bits == 0 || c.v_bits == 0) {
        std::vector<uint16_t> kp(s.k_pages.size()), vp(s.v_pages.size());
        DOWNLOAD(kp, d.k.p);
        DOWNLOAD(vp, d.v.p);
        std::vector<uint16_t> kwant = s.k_pages, vwant = s.v_pages;
        const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
        for (int b = 0; b < s.batch; ++b) {
            for (int t = 0; t < c.seqs[b].q_len; ++t) {
                const int pos = c.seqs[b].len - c.seqs[b].q_len + t;
                const int page = s.page_table[static_cast<size_t>(b) * s.max_pages + pos / c.page_size];
                const size_t dst = (static_cast<size_t>(page) * c.page_size + pos % c.page_size) * row;
                const size_t src = static_cast<size_t>(s.q_start[b] + t) * row;
                std::copy(s.kn_bits.begin() + src, s.kn_bits.begin() + src + row, kwant.begin() + dst);
                std::copy(s.vn_bits.begin() + src, s.vn_bits.begin() + src + row, vwant.begin() + dst);
            }
        }
        if (c.k_bits == 0) {
            ASSERT_TRUE(kp == kwant) << c.name << ": kv_append wrote K wrong";
        }
        if (c.v_bits == 0) {
            ASSERT_TRUE(vp == vwant) << c.name << ": kv_append wrote V wrong";
        }
    }

    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const size_t ws_bytes =
        cuda::attention_workspace_bytes(d.plan, c.n_heads, c.head_dim, c.k_bits, c.v_bits, tuning);
    DevBuf<unsigned char> ws(ws_bytes);
    if (ws_bytes) {
        ASSERT_NE(ws.p, nullptr);
    }
    const int splits =
        cuda::attention_num_splits(d.plan, c.n_heads, c.n_kv_heads, c.head_dim, c.k_bits, c.v_bits, tuning);
    DevBuf<float> dsinks(s.sinks.size());
    if (c.sinks) UPLOAD(dsinks.p, s.sinks);
    const float* sinks = c.sinks ? dsinks.p : nullptr;

    EXL3_CUDA_OK(cudaMemset(d.out.p, 0xFF, s.q_bits.size() * 2));  // 0xFFFF is NaN in bf16 and fp16
    EXL3_CUDA_OK(cuda::attention(d.q.p, d.kv, d.plan, c.n_heads, c.window, scale, d.out.p, ws.p, nullptr, nullptr,
                                 nullptr, tuning, c.softcap, sinks));
    EXL3_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(s.q_bits.size());
    DOWNLOAD(got, d.out.p);
    const auto ref = s.reference(scale, c.softcap);
    const ErrStats e = compare(got, ref, c.dtype);
    const int warps =
        cuda::attention_decode_warps(d.plan, c.n_heads, c.n_kv_heads, c.head_dim, c.k_bits, c.v_bits, tuning);
    std::printf("[attn] %-34s splits %3d  warps %d  max|ref| %.3f  max abs err %.3e  rel %.3e\n", c.name.c_str(),
                splits, warps, e.max_ref, e.max_abs, e.max_abs / e.max_ref);
    EXPECT_EQ(e.bad, 0u) << c.name << ": non-finite or unwritten outputs";
    EXPECT_LE(e.max_abs, 2e-2 * e.max_ref) << c.name;
    if (splits > 1) {  // both merge kernels (a warp per 128 columns, the default; a block per row): the same bits
        cuda::AttentionTuning block_merge = tuning;
        block_merge.combine_warp = false;
        EXL3_CUDA_OK(cudaMemset(d.out.p, 0xFF, s.q_bits.size() * 2));
        EXL3_CUDA_OK(cuda::attention(d.q.p, d.kv, d.plan, c.n_heads, c.window, scale, d.out.p, ws.p, nullptr, nullptr,
                                     nullptr, block_merge, c.softcap, sinks));
        EXL3_CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint16_t> blk(s.q_bits.size());
        DOWNLOAD(blk, d.out.p);
        EXPECT_TRUE(blk == got) << c.name << ": the two merge kernels differ";
    }

    // With the o projection's EXL3 input rotation (AttnOutRotation): where the plan merges splits, the merge kernel
    // writes the same output bits and xh bit-identical to the EXL3 rotation kernel run on that output.
    const int k = c.n_heads * c.head_dim;
    if (k % 128 != 0) return;
    std::mt19937 rng(seed ^ 0x5u);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    std::vector<float> suh(static_cast<size_t>(k));
    for (auto& x : suh) x = U(rng) < 0 ? -1.0f - 0.25f * U(rng) : 1.0f + 0.25f * U(rng);  // signs and scales
    DevBuf<float> dsuh(suh.size());
    UPLOAD(dsuh.p, suh);
    const size_t rows = s.q_bits.size() / static_cast<size_t>(k);
    DevBuf<uint16_t> xh(rows * k), xh_ref(rows * k), out2(s.q_bits.size());
    EXL3_CUDA_OK(cudaMemset(xh.p, 0xFF, rows * k * 2));
    EXL3_CUDA_OK(cudaMemset(out2.p, 0xFF, s.q_bits.size() * 2));
    cuda::AttnOutRotation rot;
    rot.suh = dsuh.p;
    rot.xh = xh.p;
    bool rotated = false;
    EXL3_CUDA_OK(
        cuda::attention(d.q.p, d.kv, d.plan, c.n_heads, c.window, scale, out2.p, ws.p, nullptr, &rot, &rotated, tuning,
                        c.softcap, sinks));
    EXPECT_EQ(rotated, splits > 1) << c.name;  // a merge kernel runs where the plan splits
    cuda::Exl3DevWeights w;                    // only suh and the shape are read by the rotation kernel
    w.trellis = reinterpret_cast<const uint16_t*>(dsuh.p);
    w.suh = dsuh.p;
    w.svh = dsuh.p;
    w.k = w.k_pad = k;
    w.n = w.n_pad = 128;
    w.K = 4;
    EXL3_CUDA_OK(cuda::exl3_rotate_in(w, out2.p,
                                      c.dtype == AttnDType::kBF16 ? cuda::ActType::kBF16 : cuda::ActType::kF16, k,
                                      static_cast<int>(rows), xh_ref.p, nullptr));
    EXL3_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> got2(s.q_bits.size()), gx(rows * k), wx(rows * k);
    DOWNLOAD(got2, out2.p);
    EXPECT_TRUE(got2 == got) << c.name << ": the output differs with the rotation";
    if (!rotated) return;
    DOWNLOAD(gx, xh.p);
    DOWNLOAD(wx, xh_ref.p);
    size_t diff = 0;
    for (size_t i = 0; i < gx.size(); ++i) diff += gx[i] != wx[i];
    std::printf("[attn] %-34s merge + rotation: %zu of %zu xh values differ from the EXL3 rotation kernel\n",
                c.name.c_str(), diff, gx.size());
    EXPECT_EQ(diff, 0u) << c.name;
}

const Case kCases[] = {
    {"decode_bf16_d128_g4_p16", AttnDType::kBF16, 128, 32, 8, 16, 0, {{1, 1}, {17, 1}, {64, 1}, {150, 1}, {300, 1}}},
    {"decode_f16_d64_g4_p64_w37", AttnDType::kF16, 64, 8, 2, 64, 37, {{5, 1}, {100, 1}, {299, 1}}},
    {"decode_bf16_d128_long_split", AttnDType::kBF16, 128, 32, 8, 64, 0, {{3000, 1}}},
    {"decode_f16_d128_long_w37", AttnDType::kF16, 128, 32, 8, 16, 37, {{2900, 1}, {45, 1}}},
    {"prefill_bf16_d128_g4_p64", AttnDType::kBF16, 128, 32, 8, 64, 0, {{300, 300}}},
    {"prefill_f16_d128_g4_p16_w37", AttnDType::kF16, 128, 32, 8, 16, 37, {{257, 257}, {31, 31}}},
    {"mixed_bf16_d128_g4_p16", AttnDType::kBF16, 128, 32, 8, 16, 0, {{300, 120}, {50, 1}, {77, 77}, {1, 1}, {260, 3}}},
    {"mixed_f16_d128_g1_p64_w37", AttnDType::kF16, 128, 8, 8, 64, 37, {{200, 200}, {33, 5}, {129, 1}}},
    {"mixed_bf16_d64_g7_p16", AttnDType::kBF16, 64, 14, 2, 16, 0, {{100, 40}, {300, 1}, {64, 64}}},
    {"mixed_f16_d64_g4_p64", AttnDType::kF16, 64, 16, 4, 64, 0, {{180, 60}, {2, 2}, {299, 7}, {70, 1}}},
    {"mixed_bf16_d256_g2_p64", AttnDType::kBF16, 256, 4, 2, 64, 0, {{150, 150}, {300, 1}, {90, 17}}},
    {"decode_f16_d256_g2_p16_w37", AttnDType::kF16, 256, 4, 2, 16, 37, {{250, 1}, {40, 1}}},
    // Quantized KV: every bit width on each side, 16-bit beside quantized, lengths off the page and group sizes.
    {"q_decode_bf16_d128_g4_p16_k8v8", AttnDType::kBF16, 128, 32, 8, 16, 0,
     {{1, 1}, {17, 1}, {64, 1}, {150, 1}, {300, 1}}, 8, 8},
    {"q_decode_f16_d64_g4_p64_w37_k4v4", AttnDType::kF16, 64, 8, 2, 64, 37, {{5, 1}, {100, 1}, {299, 1}}, 4, 4},
    {"q_decode_bf16_d128_long_split_k6v6", AttnDType::kBF16, 128, 32, 8, 64, 0, {{3000, 1}}, 6, 6},
    {"q_decode_f16_d128_long_k8v4", AttnDType::kF16, 128, 32, 8, 16, 0, {{2900, 1}, {45, 1}}, 8, 4},
    {"q_decode_bf16_d64_g1_p16_k6v4", AttnDType::kBF16, 64, 6, 6, 16, 0, {{33, 1}, {97, 1}, {2, 1}}, 6, 4},
    {"q_decode_f16_d256_g2_p16_k4v8", AttnDType::kF16, 256, 4, 2, 16, 0, {{250, 1}, {40, 1}}, 4, 8},
    {"q_prefill_bf16_d128_g4_p64_k8v8", AttnDType::kBF16, 128, 32, 8, 64, 0, {{300, 300}}, 8, 8},
    {"q_prefill_f16_d64_g3_p16_w37_k6v4", AttnDType::kF16, 64, 6, 2, 16, 37, {{257, 257}, {31, 31}}, 6, 4},
    {"q_prefill_bf16_d256_g2_p64_k8v6", AttnDType::kBF16, 256, 4, 2, 64, 0, {{150, 150}, {90, 17}}, 8, 6},
    {"q_mixed_bf16_d128_g4_p16_k4v4", AttnDType::kBF16, 128, 32, 8, 16, 0,
     {{300, 120}, {50, 1}, {77, 77}, {1, 1}, {260, 3}}, 4, 4},
    {"q_mixed_bf16_d64_g7_p16_k0v4", AttnDType::kBF16, 64, 14, 2, 16, 0, {{100, 40}, {300, 1}, {64, 64}}, 0, 4},
    {"q_mixed_f16_d128_g1_p64_w37_k8v0", AttnDType::kF16, 128, 8, 8, 64, 37, {{200, 200}, {33, 5}, {129, 1}}, 8, 0},
    // Gemma 2's soft-cap on the scores (small enough to bite on these inputs): head_dim 256 and 128, windowed.
    {"cap_mixed_bf16_d256_g2_p64_w37", AttnDType::kBF16, 256, 8, 4, 64, 37, {{150, 150}, {300, 1}, {90, 17}}, 0, 0, 2.0f},
    {"cap_decode_f16_d128_g2_p16", AttnDType::kF16, 128, 16, 8, 16, 0, {{250, 1}, {3000, 1}}, 0, 0, 2.0f},
    {"cap_prefill_bf16_d128_g2_p64_k8v8", AttnDType::kBF16, 128, 16, 8, 64, 0, {{257, 257}}, 8, 8, 2.0f},
    {"q_mixed_f16_d64_g4_p64_k6v8", AttnDType::kF16, 64, 16, 4, 64, 0, {{180, 60}, {2, 2}, {299, 7}, {70, 1}}, 6, 8},
    // gpt-oss's attention sinks (head_dim 64, 8 query heads a KV head, its window of 128 and full layers): the first
    // split of each row adds the sink, the merge divides once; decode split and not, prefill, mixed, quantized.
    {"sink_decode_bf16_d64_g8_p16", AttnDType::kBF16, 64, 64, 8, 16, 0, {{1, 1}, {17, 1}, {300, 1}, {3000, 1}}, 0, 0,
     0.0f, true},
    {"sink_decode_bf16_d64_g8_p64_w128", AttnDType::kBF16, 64, 64, 8, 64, 128, {{5, 1}, {129, 1}, {1000, 1}}, 0, 0,
     0.0f, true},
    {"sink_prefill_bf16_d64_g8_p64_w128", AttnDType::kBF16, 64, 64, 8, 64, 128, {{300, 300}, {31, 31}}, 0, 0, 0.0f,
     true},
    {"sink_prefill_f16_d64_g8_p16", AttnDType::kF16, 64, 16, 2, 16, 0, {{257, 257}}, 0, 0, 0.0f, true},
    {"sink_mixed_bf16_d64_g8_p16_w128", AttnDType::kBF16, 64, 64, 8, 16, 128,
     {{300, 120}, {50, 1}, {77, 77}, {1, 1}, {2600, 3}}, 0, 0, 0.0f, true},
    {"sink_mixed_f16_d128_g4_p64_k8v8", AttnDType::kF16, 128, 32, 8, 64, 0, {{300, 120}, {50, 1}, {1300, 1}}, 8, 8,
     0.0f, true},
    {"sink_decode_bf16_d64_g8_long_w128_k4v4", AttnDType::kBF16, 64, 64, 8, 16, 128, {{2900, 1}, {45, 1}}, 4, 4, 0.0f,
     true},
};

class PagedAttention : public ::testing::TestWithParam<int> {};

TEST_P(PagedAttention, MatchesCpuReference) {
    EXL3_REQUIRE_GPU();
    const Case& c = kCases[GetParam()];
    run_case(c, 1234u + static_cast<uint32_t>(GetParam()));
    run_case(c, 777u + static_cast<uint32_t>(GetParam()));  // fresh inputs: the same function on any data
}

INSTANTIATE_TEST_SUITE_P(Cases, PagedAttention, ::testing::Range(0, static_cast<int>(std::size(kCases))),
                         [](const ::testing::TestParamInfo<int>& i) { return kCases[i.param].name; });

// Every decode shape on every single-token case (16-bit and quantized caches): DecodeShape (4 warps of 16-key
// slices), DecodeWideShape (8 warps of 8-key slices) and DecodeLeanShape (2 stages; 32-key tiles at head_dim 256: the
// shape of GPUs with less shared memory a block), forced whatever the planner would choose, with the plan's own
// splits.
TEST_P(PagedAttention, BothDecodeShapes) {
    EXL3_REQUIRE_GPU();
    const Case& c = kCases[GetParam()];
    const bool one_token = std::all_of(c.seqs.begin(), c.seqs.end(), [](const auto& q) { return q.q_len == 1; });
    if (!one_token) GTEST_SKIP() << "not a decode step";
    for (int warps : {4, 8}) {
        cuda::AttentionTuning t;
        t.decode_warps = warps;
        run_case(c, 4321u + static_cast<uint32_t>(GetParam()), t);
    }
    cuda::AttentionTuning lean;
    lean.decode_lean = true;
    run_case(c, 4321u + static_cast<uint32_t>(GetParam()), lean);
}

// A CUDA graph captured at one step must replay correctly at a later step with longer device-side lengths, as
// long as they stay inside the host-side bounds it was captured with.
void run_graph_replay(bool decode, const cuda::AttentionTuning& tuning = {}) {
    EXL3_REQUIRE_GPU();
    const int D = 128, H = 32, KV = 8, P = 64;
    // Bounds: captured with these; device values start smaller and grow before the replay.
    Case late{"late", AttnDType::kBF16, D, H, KV, P, 0, {}};
    Case early{"early", AttnDType::kBF16, D, H, KV, P, 0, {}};
    if (decode) {
        early.seqs = {{10, 1}, {200, 1}, {1, 1}};
        late.seqs = {{700, 1}, {1500, 1}, {64, 1}};
    } else {
        early.seqs = {{40, 20}, {10, 10}, {5, 1}};
        late.seqs = {{300, 90}, {200, 100}, {129, 1}};
    }
    const Step s_late(late, 99u);
    const Step s_early(early, 98u);
    // The plan is built from the late step's bounds, and the page pool is the late step's (a superset).
    DevStep d(s_late);
    ASSERT_NE(d.k.p, nullptr);
    auto upload_step = [&](const Step& s) {
        // early: reuses the late pool's page table layout so both fit one captured plan.
        UPLOAD(d.q_start.p, s.q_start);
        UPLOAD(d.seq_len.p, s.seq_len);
        UPLOAD(d.page_table.p, s.page_table);
        UPLOAD(d.q.p, s.q_bits);
        std::vector<uint16_t> kp = s.k_pages, vp = s.v_pages;
        kp.resize(s_late.k_pages.size(), 0x3c00);
        vp.resize(s_late.v_pages.size(), 0x3c00);
        UPLOAD(d.k.p, kp);
        UPLOAD(d.v.p, vp);
        UPLOAD(d.kn.p, s.kn_bits);
        UPLOAD(d.vn.p, s.vn_bits);
    };
    ASSERT_LE(s_early.max_pages, s_late.max_pages);
    // The early step's page table must use the late stride: rebuild it with max_pages of the late plan.
    Step e2 = s_early;
    e2.page_table.assign(static_cast<size_t>(s_late.batch) * s_late.max_pages, -1);
    for (int b = 0; b < s_early.batch; ++b)
        for (int i = 0; i < s_early.max_pages; ++i)
            e2.page_table[static_cast<size_t>(b) * s_late.max_pages + i] =
                s_early.page_table[static_cast<size_t>(b) * s_early.max_pages + i];
    ASSERT_LE(e2.num_pages, s_late.num_pages);

    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const size_t ws_bytes = cuda::attention_workspace_bytes(d.plan, H, D, 0, 0, tuning);
    DevBuf<unsigned char> ws(ws_bytes);
    cudaStream_t st;
    EXL3_CUDA_OK(cudaStreamCreate(&st));
    const size_t out_bytes = s_late.q_bits.size() * 2;

    upload_step(e2);
    // First (eager) call: sets kernel attributes outside capture, as an engine's warm-up step would.
    EXL3_CUDA_OK(cuda::kv_append(d.kv, d.plan, d.kn.p, d.vn.p, st));
    EXL3_CUDA_OK(cuda::attention(d.q.p, d.kv, d.plan, H, 0, scale, d.out.p, ws.p, st, nullptr, nullptr, tuning));
    EXL3_CUDA_OK(cudaStreamSynchronize(st));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EXL3_CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    EXL3_CUDA_OK(cudaMemsetAsync(d.out.p, 0xFF, out_bytes, st));
    EXL3_CUDA_OK(cuda::kv_append(d.kv, d.plan, d.kn.p, d.vn.p, st));
    EXL3_CUDA_OK(cuda::attention(d.q.p, d.kv, d.plan, H, 0, scale, d.out.p, ws.p, st, nullptr, nullptr, tuning));
    EXL3_CUDA_OK(cudaStreamEndCapture(st, &graph));
    EXL3_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    for (const Step* s : {static_cast<const Step*>(&e2), &s_late}) {
        upload_step(*s);
        EXL3_CUDA_OK(cudaGraphLaunch(exec, st));
        EXL3_CUDA_OK(cudaStreamSynchronize(st));
        const size_t n = static_cast<size_t>(s->total_q) * H * D;
        std::vector<uint16_t> got(n);
        EXL3_CUDA_OK(cudaMemcpy(got.data(), d.out.p, n * 2, cudaMemcpyDeviceToHost));
        const auto ref = s->reference(scale);
        const ErrStats e = compare(got, ref, AttnDType::kBF16);
        std::printf("[attn] graph replay %-7s %-5s total_q %4d  max abs err %.3e  rel %.3e\n",
                    decode ? "decode" : "prefill", s == &e2 ? "early" : "late", s->total_q, e.max_abs,
                    e.max_abs / e.max_ref);
        EXPECT_EQ(e.bad, 0u);
        EXPECT_LE(e.max_abs, 2e-2 * e.max_ref);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
}

TEST(PagedAttentionGraph, DecodeReplaysWithLongerLengths) { run_graph_replay(true); }
TEST(PagedAttentionGraph, PrefillReplaysWithLongerLengths) { run_graph_replay(false); }
TEST(PagedAttentionGraph, BothDecodeShapesReplay) {
    for (int warps : {4, 8}) {
        cuda::AttentionTuning t;
        t.decode_warps = warps;
        run_graph_replay(true, t);
    }
}

// The batch-invariant plan (AttentionBatch::fixed_split_keys): every sequence's output rows are the same bits in a
// mixed step (prompt chunks beside decode tokens), in a batch of its own, and -- for the decode tokens -- in a step
// of decode tokens only; and the mixed step matches the CPU reference.
void run_invariance(const Case& c, uint32_t seed) {
    const Step s(c, seed);
    DevStep d(s);
    ASSERT_NO_FATAL_FAILURE(upload(s, d));
    d.plan.fixed_split_keys = 512;
    EXL3_CUDA_OK(cuda::kv_append(d.kv, d.plan, d.kn.p, d.vn.p, nullptr));  // the cache now holds every token
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const size_t row = static_cast<size_t>(c.n_heads) * c.head_dim;
    DevBuf<float> dsinks(s.sinks.size());
    if (c.sinks) UPLOAD(dsinks.p, s.sinks);

    // Attention of the sequences `which` (indices into the step) as one batch of their own; their output rows.
    auto run_subset = [&](const std::vector<int>& which, std::vector<uint16_t>* got) {
        std::vector<int32_t> qs{0}, sl, pt;
        std::vector<uint16_t> q;
        int max_q = 0, max_len = 0;
        for (int b : which) {
            const int ql = c.seqs[b].q_len;
            qs.push_back(qs.back() + ql);
            sl.push_back(c.seqs[b].len);
            max_q = std::max(max_q, ql);
            max_len = std::max(max_len, c.seqs[b].len);
            pt.insert(pt.end(), s.page_table.begin() + static_cast<long>(b) * s.max_pages,
                      s.page_table.begin() + static_cast<long>(b + 1) * s.max_pages);
            q.insert(q.end(), s.q_bits.begin() + static_cast<long>(s.q_start[b] * row),
                     s.q_bits.begin() + static_cast<long>(s.q_start[b + 1] * row));
        }
        DevBuf<int32_t> dqs(qs.size()), dsl(sl.size()), dpt(pt.size());
        DevBuf<uint16_t> dq(q.size()), dout(q.size());
        UPLOAD(dqs.p, qs);
        UPLOAD(dsl.p, sl);
        UPLOAD(dpt.p, pt);
        UPLOAD(dq.p, q);
        cuda::AttentionBatch pl{static_cast<int>(which.size()), dqs.p, dsl.p, dpt.p, s.max_pages, qs.back(), max_q,
                                max_len};
        pl.fixed_split_keys = 512;
        DevBuf<unsigned char> ws(cuda::attention_workspace_bytes(pl, c.n_heads, c.head_dim, c.k_bits, c.v_bits));
        EXL3_CUDA_OK(cudaMemset(dout.p, 0xFF, q.size() * 2));
        EXL3_CUDA_OK(cuda::attention(dq.p, d.kv, pl, c.n_heads, c.window, scale, dout.p, ws.p, nullptr, nullptr,
                                     nullptr, {}, 0.f, c.sinks ? dsinks.p : nullptr));
        EXL3_CUDA_OK(cudaDeviceSynchronize());
        got->resize(q.size());
        DOWNLOAD(*got, dout.p);
    };
    std::vector<int> all(c.seqs.size()), decode;
    std::iota(all.begin(), all.end(), 0);
    for (int b : all)
        if (c.seqs[b].q_len == 1) decode.push_back(b);
    std::vector<uint16_t> mixed, one, dec;
    run_subset(all, &mixed);
    const ErrStats e = compare(mixed, s.reference(scale), c.dtype);
    EXPECT_EQ(e.bad, 0u) << c.name;
    EXPECT_LE(e.max_abs, 2e-2 * e.max_ref) << c.name;
    auto rows_of = [&](const std::vector<uint16_t>& v, int b) {  // sequence b's rows of the whole step's output
        return std::vector<uint16_t>(v.begin() + static_cast<long>(s.q_start[b] * row),
                                     v.begin() + static_cast<long>(s.q_start[b + 1] * row));
    };
    int same = 0;
    for (int b : all) {
        run_subset({b}, &one);
        const bool eq = one == rows_of(mixed, b);
        EXPECT_TRUE(eq) << c.name << ": sequence " << b << " (len " << c.seqs[b].len << ", " << c.seqs[b].q_len
                        << " new) alone differs from the mixed step";
        same += eq;
    }
    run_subset(decode, &dec);
    for (size_t i = 0; i < decode.size(); ++i) {
        const std::vector<uint16_t> r(dec.begin() + static_cast<long>(i * row), dec.begin() + static_cast<long>((i + 1) * row));
        EXPECT_TRUE(r == rows_of(mixed, decode[i])) << c.name << ": decode sequence " << decode[i]
                                                    << " differs between a decode-only step and the mixed step";
    }
    std::printf("[attn] invariant %-30s %d of %zu sequences alone == in the mixed step; %zu decode tokens checked "
                "in a decode-only step; vs CPU rel %.3e\n",
                c.name.c_str(), same, all.size(), decode.size(), e.max_abs / e.max_ref);
}

TEST(PagedAttentionInvariant, RowsDoNotDependOnTheBatch) {
    EXL3_REQUIRE_GPU();
    const Case cases[] = {
        {"inv_bf16_d128_g4_p16", AttnDType::kBF16, 128, 32, 8, 16, 0,
         {{300, 120}, {700, 1}, {77, 77}, {1, 1}, {1300, 1}, {260, 3}, {513, 1}}},
        {"inv_f16_d64_g7_p64_w37", AttnDType::kF16, 64, 14, 2, 64, 37, {{100, 40}, {1030, 1}, {64, 64}, {2, 1}}},
        {"inv_bf16_d256_g2_p64", AttnDType::kBF16, 256, 4, 2, 64, 0, {{150, 150}, {900, 1}, {90, 17}}},
        {"inv_q_bf16_d128_g4_p16_k8v4", AttnDType::kBF16, 128, 32, 8, 16, 0,
         {{300, 120}, {700, 1}, {1, 1}, {1100, 1}, {260, 3}}, 8, 4},
        {"inv_sink_bf16_d64_g8_p16_w128", AttnDType::kBF16, 64, 64, 8, 16, 128,
         {{300, 120}, {700, 1}, {77, 77}, {1, 1}, {1300, 1}}, 0, 0, 0.0f, true},
    };
    for (const Case& c : cases) run_invariance(c, 4242u);
}

TEST(PagedAttentionArgs, RejectsBadShapes) {
    EXL3_REQUIRE_GPU();
    int32_t* dummy = nullptr;
    cuda::PagedKV kv{nullptr, nullptr, 1, 16, 3, 128, AttnDType::kBF16};
    cuda::AttentionBatch b{1, dummy, dummy, dummy, 1, 1, 1, 1};
    EXPECT_EQ(cuda::attention(nullptr, kv, b, 32, 0, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    kv.n_kv_heads = 8;
    kv.head_dim = 96;
    EXPECT_EQ(cuda::attention(nullptr, kv, b, 32, 0, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    cudaGetLastError();
}

// KV bits other than 0, 4, 6, 8, and a quantized side without its parameters, are refused by both entry points
// before anything is launched.
TEST(PagedAttentionArgs, RejectsBadKvBits) {
    EXL3_REQUIRE_GPU();
    int32_t* dummy = nullptr;
    char byte = 0;
    void* some = &byte;  // never dereferenced: the checks come first
    cuda::AttentionBatch b{1, dummy, dummy, dummy, 1, 1, 1, 1};
    for (auto [kb, vb] : {std::pair{5, 0}, {0, 3}, {16, 16}, {-1, 8}, {2, 2}}) {
        cuda::PagedKV kv{some, some, 1, 16, 8, 128, AttnDType::kBF16, kb, vb, some, some};
        EXPECT_EQ(cuda::attention(nullptr, kv, b, 32, 0, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue)
            << kb << "/" << vb;
        EXPECT_EQ(cuda::kv_append(kv, b, nullptr, nullptr, nullptr), cudaErrorInvalidValue) << kb << "/" << vb;
    }
    cuda::PagedKV kv{some, some, 1, 16, 8, 128, AttnDType::kBF16, 8, 4, nullptr, some};
    EXPECT_EQ(cuda::attention(nullptr, kv, b, 32, 0, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(cuda::kv_append(kv, b, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    kv.k_params = some;
    kv.v_params = nullptr;
    EXPECT_EQ(cuda::attention(nullptr, kv, b, 32, 0, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(cuda::kv_append(kv, b, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
    cudaGetLastError();
}

}  // namespace
}  // namespace exl3
