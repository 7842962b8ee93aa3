// Tile bitstream and element order, checked against a bit-by-bit model of the spec text.
#include "quant/trellis.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "core/dtype.h"
#include "quant/codebook.h"
#include "test_util.h"

namespace exl3::quant {
namespace {

// Bit i of the stream made of 256 K-bit symbols, MSB of each symbol first.
int stream_bit(const std::vector<uint16_t>& sym, int K, int i) {
    return (sym[i / K] >> (K - 1 - i % K)) & 1;
}

// s_p = the 16 stream bits ending at bit (p+1)K, indices modulo 256K.
std::vector<uint16_t> states_from_symbols(const std::vector<uint16_t>& sym, int K) {
    std::vector<uint16_t> s(256);
    const int total = 256 * K;
    for (int p = 0; p < 256; ++p) {
        uint32_t v = 0;
        for (int b = (p + 1) * K - 16; b < (p + 1) * K; ++b)
            v = v << 1 | stream_bit(sym, K, ((b % total) + total) % total);
        s[p] = static_cast<uint16_t>(v);
    }
    return s;
}

// The 16K uint16 words: u[i] holds stream bits 32i..32i+31 with bit 32i as its MSB; w16[2i] is u's low half.
std::vector<uint16_t> words_from_symbols(const std::vector<uint16_t>& sym, int K) {
    std::vector<uint16_t> w(16 * K);
    for (int i = 0; i < 8 * K; ++i) {
        uint32_t u = 0;
        for (int b = 0; b < 32; ++b) u = u << 1 | stream_bit(sym, K, 32 * i + b);
        w[2 * i] = static_cast<uint16_t>(u & 0xFFFF);
        w[2 * i + 1] = static_cast<uint16_t>(u >> 16);
    }
    return w;
}

TEST(Trellis, ElementOrderIsTheMmaLayout) {
    const uint8_t* o = tile_element_order();
    std::set<int> seen(o, o + 256);
    EXPECT_EQ(seen.size(), 256u);
    auto rc = [&](int p) { return std::pair<int, int>(o[p] / 16, o[p] % 16); };
    EXPECT_EQ(rc(0), std::make_pair(0, 0));
    EXPECT_EQ(rc(1), std::make_pair(1, 0));
    EXPECT_EQ(rc(2), std::make_pair(8, 0));
    EXPECT_EQ(rc(3), std::make_pair(9, 0));
    EXPECT_EQ(rc(4), std::make_pair(0, 8));
    EXPECT_EQ(rc(7), std::make_pair(9, 8));
    EXPECT_EQ(rc(8), std::make_pair(2, 0));      // t = 1: r0 = 2
    EXPECT_EQ(rc(24), std::make_pair(6, 0));     // t = 3: r0 = 6
    EXPECT_EQ(rc(32), std::make_pair(0, 1));     // t = 4: c0 = 1
    EXPECT_EQ(rc(255), std::make_pair(15, 15));  // t = 31, j = 7: (6 + 9, 7 + 8)
}

TEST(Trellis, WordLayoutAndWrapAroundByHand) {
    // Only stream bit 0 set: it is the MSB of u[0], i.e. bit 15 of the second uint16 word.
    std::vector<uint16_t> w(16 * 4, 0);
    w[1] = 0x8000;
    uint16_t s[256];
    unpack_tile_states(w.data(), 4, s);
    EXPECT_EQ(s[0], 0x0008);  // window bits -12..3 (wrapping): bit 0 sits 12 places from the MSB
    EXPECT_EQ(s[1], 0x0080);
    EXPECT_EQ(s[2], 0x0800);
    EXPECT_EQ(s[3], 0x8000);  // bits 0..15
    EXPECT_EQ(s[4], 0x0000);
    EXPECT_EQ(s[255], 0x0000);
    // Only the last stream bit set (LSB of u[31] = bit 0 of word 62): s_255 ends there, and the wrapped windows
    // of s_0..s_2 still see it.
    std::fill(w.begin(), w.end(), 0);
    w[62] = 0x0001;
    unpack_tile_states(w.data(), 4, s);
    EXPECT_EQ(s[255], 0x0001);
    EXPECT_EQ(s[254], 0x0000);
    EXPECT_EQ(s[0], 0x0010);
    EXPECT_EQ(s[2], 0x1000);
    EXPECT_EQ(s[3], 0x0000);
}

TEST(Trellis, PackUnpackRoundTripEveryK) {
    std::mt19937 rng(1234);
    for (int K = kMinBits; K <= kMaxBits; ++K) {
        for (int trial = 0; trial < 50; ++trial) {
            std::vector<uint16_t> sym(256);
            for (auto& v : sym) v = static_cast<uint16_t>(rng() & ((1u << K) - 1));
            std::vector<uint16_t> states = states_from_symbols(sym, K);
            ASSERT_TRUE(tile_states_consistent(states.data(), K)) << "K=" << K;
            std::vector<uint16_t> words(16 * K);
            pack_tile_states(states.data(), K, words.data());
            ASSERT_EQ(words, words_from_symbols(sym, K)) << "K=" << K;
            std::vector<uint16_t> back(256);
            unpack_tile_states(words.data(), K, back.data());
            ASSERT_EQ(back, states) << "K=" << K;
            // Unaligned input: the words may sit at any byte offset of a mapped file.
            std::vector<uint8_t> shifted(2 * words.size() + 1);
            std::memcpy(shifted.data() + 1, words.data(), 2 * words.size());
            unpack_tile_states(shifted.data() + 1, K, back.data());
            ASSERT_EQ(back, states);
            // A state that breaks the overlap rule is caught.
            states[rng() % 256] ^= static_cast<uint16_t>(1u << (15 - rng() % (16 - K)));
            EXPECT_FALSE(tile_states_consistent(states.data(), K)) << "K=" << K;
        }
    }
}

TEST(Trellis, DecodeTilePlacesCodebookValuesInMmaOrder) {
    std::mt19937 rng(99);
    for (int K = kMinBits; K <= kMaxBits; ++K) {
        std::vector<uint16_t> words(16 * K);
        for (auto& w : words) w = static_cast<uint16_t>(rng());
        uint16_t states[256];
        unpack_tile_states(words.data(), K, states);
        const float* lut = codebook_lut(Codebook::k3Inst);
        float tile[256];
        decode_tile(words.data(), K, lut, tile);
        const uint8_t* o = tile_element_order();
        for (int p = 0; p < 256; ++p) ASSERT_EQ(tile[o[p]], lut[states[p]]) << "K=" << K << " p=" << p;
    }
}

// Real tiles of the reference implementation's files with their decoded fp16 values (see the fixture's header):
// pins the whole decode path bit for bit, without the shared folder.
TEST(Trellis, GoldenTilesFromARealFile) {
    std::ifstream f(exl3::test::repo_path("tests/fixtures/quant/golden_tiles.txt"));
    ASSERT_TRUE(f.good());
    std::string line;
    int K = 0, checked = 0;
    std::vector<uint16_t> words;
    auto hex_list = [](std::istringstream& is) {
        std::vector<uint16_t> v;
        std::string tok;
        while (is >> tok) v.push_back(static_cast<uint16_t>(std::stoul(tok, nullptr, 16)));
        return v;
    };
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream is(line);
        std::string head;
        is >> head;
        if (head == "tile") {
            std::string name, kw;
            is >> name >> kw >> K;
        } else if (head == "words") {
            words = hex_list(is);
            ASSERT_EQ(words.size(), static_cast<size_t>(16 * K));
        } else {
            Codebook cb;
            ASSERT_TRUE(codebook_from_name(head, &cb)) << head;
            std::vector<uint16_t> expect = hex_list(is);
            ASSERT_EQ(expect.size(), 256u);
            float out[256];
            decode_tile(words.data(), K, codebook_lut(cb), out);
            for (int i = 0; i < 256; ++i) ASSERT_EQ(f32_to_f16(out[i]), expect[i]) << head << " K=" << K << " " << i;
            checked++;
        }
    }
    EXPECT_EQ(checked, 6);
}

}  // namespace
}  // namespace exl3::quant
