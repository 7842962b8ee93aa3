#include "quant/trellis.h"

#include <cstring>

namespace exl3::quant {

namespace {

struct ElementOrder {
    uint8_t idx[kTileValues];
    ElementOrder() {
        static constexpr int kDr[8] = {0, 1, 8, 9, 0, 1, 8, 9};
        static constexpr int kDc[8] = {0, 0, 0, 0, 8, 8, 8, 8};
        for (int t = 0; t < 32; ++t) {
            int r0 = (t % 4) * 2, c0 = t / 4;
            for (int j = 0; j < 8; ++j) idx[8 * t + j] = static_cast<uint8_t>((r0 + kDr[j]) * 16 + c0 + kDc[j]);
        }
    }
};
const ElementOrder kOrder;

// The tile's stream as uint32 words plus one extra copy of u[0], so that any 16-bit window (which straddles at
// most two words) can be read without a modulo. At most 8*8 + 1 words.
inline int load_stream(const void* words, int K, uint32_t* u) {
    const int nw = 8 * K;
    const auto* b = static_cast<const uint8_t*>(words);
    for (int i = 0; i < nw; ++i) {
        // u[i] = w16[2i] | w16[2i+1] << 16 with little-endian words is a little-endian uint32 read.
        u[i] = static_cast<uint32_t>(b[4 * i]) | static_cast<uint32_t>(b[4 * i + 1]) << 8 |
               static_cast<uint32_t>(b[4 * i + 2]) << 16 | static_cast<uint32_t>(b[4 * i + 3]) << 24;
    }
    u[nw] = u[0];
    return nw;
}

inline uint16_t window(const uint32_t* u, int start) {
    // start in [0, 256K); bits start .. start+15 of the stream, MSB first.
    int i = start >> 5, off = start & 31;
    uint64_t v = static_cast<uint64_t>(u[i]) << 32 | u[i + 1];
    return static_cast<uint16_t>(v >> (48 - off));
}

}  // namespace

const uint8_t* tile_element_order() {
    return kOrder.idx;
}

void unpack_tile_states(const void* words, int K, uint16_t* states) {
    uint32_t u[8 * kMaxBits + 1] = {};
    load_stream(words, K, u);
    const int total = 256 * K;
    for (int p = 0; p < kTileValues; ++p) {
        int start = (p + 1) * K - 16;
        if (start < 0) start += total;
        states[p] = window(u, start);
    }
}

void pack_tile_states(const uint16_t* states, int K, uint16_t* words) {
    uint32_t u[8 * kMaxBits] = {};
    for (int p = 0; p < kTileValues; ++p) {
        for (int j = 0; j < K; ++j) {
            int bit = p * K + j;  // stream position of bit K-1-j of state p
            if ((states[p] >> (K - 1 - j)) & 1u) u[bit >> 5] |= 1u << (31 - (bit & 31));
        }
    }
    for (int i = 0; i < 8 * K; ++i) {
        words[2 * i] = static_cast<uint16_t>(u[i] & 0xFFFFu);
        words[2 * i + 1] = static_cast<uint16_t>(u[i] >> 16);
    }
}

bool tile_states_consistent(const uint16_t* states, int K) {
    const uint32_t keep = (0xFFFFu >> K);  // bits of s_{p-1} that survive into s_p
    for (int p = 0; p < kTileValues; ++p) {
        uint32_t prev = states[(p + kTileValues - 1) % kTileValues];
        if (((states[p] >> K) & keep) != (prev & keep)) return false;
    }
    return true;
}

void decode_tile(const void* words, int K, const float* lut, float* w) {
    uint32_t u[8 * kMaxBits + 1] = {};
    load_stream(words, K, u);
    const int total = 256 * K;
    const uint8_t* order = kOrder.idx;
    // The first ceil(16/K) - 1 windows wrap around the end of the stream; the rest are plain.
    int p = 0;
    for (; p < kTileValues && (p + 1) * K < 16; ++p) w[order[p]] = lut[window(u, (p + 1) * K - 16 + total)];
    for (; p < kTileValues; ++p) w[order[p]] = lut[window(u, (p + 1) * K - 16)];
}

}  // namespace exl3::quant
