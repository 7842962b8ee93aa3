// End to end: a small random-weight Llama written with our safetensors writer, converted on the CPU, loaded with
// Model::load and compared with the original's logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "exl3/model.h"
#include "exl3_pair.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "quant/exl3_model.h"
#include "model_logits.h"
#include "test_util.h"

namespace exl3::convert {
namespace {

namespace fs = std::filesystem;

constexpr int kHidden = 128, kInter = 256, kLayers = 2, kHeads = 4, kKvHeads = 2, kVocab = 256;

// poison: a NaN in layer 1's down_proj; skip: a tensor left out of the checkpoint; fused: a Phi-3 checkpoint, its
// q|k|v and gate|up one tensor each.
void write_model(const std::string& dir, bool poison = false, const std::string& skip = "", bool fused = false) {
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << (fused ? R"({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",)"
                                                  : R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",)")
                                        << R"(
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5, "max_position_embeddings": 512,
        "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "float32"})";
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    SafetensorsWriter w;
    std::vector<float> pending;  // the rows of a fused tensor so far
    auto add = [&](const std::string& name, int out, int in, float sd) {
        std::vector<float> v(static_cast<size_t>(out) * (in ? in : 1));
        for (auto& x : v) x = in ? nd(rng) * sd : 1.0f + 0.1f * nd(rng);
        if (name == skip) return;
        if (fused && (name.find("_proj.weight") != std::string::npos) && name.find("o_proj") == std::string::npos &&
            name.find("down_proj") == std::string::npos) {
            pending.insert(pending.end(), v.begin(), v.end());  // the same values a split checkpoint would hold
            const bool last = name.find("v_proj") != std::string::npos || name.find("up_proj") != std::string::npos;
            if (!last) return;
            const std::string fname = name.substr(0, name.rfind('.', name.rfind(".weight") - 1) + 1) +
                                      (name.find("v_proj") != std::string::npos ? "qkv_proj.weight" : "gate_up_proj.weight");
            const int64_t rows = static_cast<int64_t>(pending.size()) / in;
            ASSERT_TRUE(w.add(fname, DType::kF32, {rows, in}, pending.data(), pending.size() * 4).is_ok());
            pending.clear();
            return;
        }
        std::vector<int64_t> shape = in ? std::vector<int64_t>{out, in} : std::vector<int64_t>{out};
        ASSERT_TRUE(w.add(name, DType::kF32, shape, v.data(), v.size() * 4).is_ok());
    };
    const int hd = kHidden / kHeads;
    add("model.embed_tokens.weight", kVocab, kHidden, 1.0f);
    add("model.norm.weight", kHidden, 0, 0);
    add("lm_head.weight", kVocab, kHidden, 0.1f);
    for (int l = 0; l < kLayers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", kHidden, 0, 0);
        add(p + "post_attention_layernorm.weight", kHidden, 0, 0);
        add(p + "self_attn.q_proj.weight", kHeads * hd, kHidden, 0.1f);
        add(p + "self_attn.k_proj.weight", kKvHeads * hd, kHidden, 0.1f);
        add(p + "self_attn.v_proj.weight", kKvHeads * hd, kHidden, 0.1f);
        add(p + "self_attn.o_proj.weight", kHidden, kHeads * hd, 0.1f);
        add(p + "mlp.gate_proj.weight", kInter, kHidden, 0.1f);
        add(p + "mlp.up_proj.weight", kInter, kHidden, 0.1f);
        if (poison && l == 1) {
            std::vector<float> v(static_cast<size_t>(kHidden) * kInter, 0.01f);
            v[5] = NAN;
            ASSERT_TRUE(w.add(p + "mlp.down_proj.weight", DType::kF32, {kHidden, kInter}, v.data(), v.size() * 4).is_ok());
        } else {
            add(p + "mlp.down_proj.weight", kHidden, kInter, 0.1f);
        }
    }
    ASSERT_TRUE(w.write(dir + "/model.safetensors").is_ok());
    std::ofstream(dir + "/tokenizer_config.json") << "{}";
}

using test::logits_of;

nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f, nullptr, false);
}

// "model.layers.12.mlp.up_proj" -> "model.layers.N.mlp.up_proj"
std::string module_kind(const std::string& name) {
    std::string out;
    for (size_t i = 0; i < name.size();) {
        if (std::isdigit(static_cast<unsigned char>(name[i]))) {
            out += 'N';
            while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
        } else {
            out += name[i++];
        }
    }
    return out;
}

// Same config fields, same quantization_config(.json) fields, and per kind of quantized module the same tensor_storage
// entry: keys, stored tensor suffixes, their dtypes and ranks, format and multiplier. (Unquantized tensors keep the
// source model's dtype, which differs here: the test model is fp32.)
void expect_same_layout(const std::string& ours, const std::string& ref) {
    auto keys = [](const nlohmann::json& j) {
        std::vector<std::string> k;
        for (auto it = j.begin(); it != j.end(); ++it) k.push_back(it.key());
        std::sort(k.begin(), k.end());
        return k;
    };
    const auto oc = read_json(ours + "/config.json"), rc = read_json(ref + "/config.json");
    ASSERT_TRUE(oc.is_object() && rc.is_object());
    EXPECT_EQ(keys(oc["quantization_config"]), keys(rc["quantization_config"]));
    const auto oq = read_json(ours + "/quantization_config.json"), rq = read_json(ref + "/quantization_config.json");
    ASSERT_TRUE(oq.is_object() && rq.is_object());
    EXPECT_EQ(keys(oq), keys(rq));
    std::map<std::string, nlohmann::json> ref_kinds;
    for (auto it = rq["tensor_storage"].begin(); it != rq["tensor_storage"].end(); ++it)
        ref_kinds.emplace(module_kind(it.key()), it.value());
    int compared = 0;
    for (auto it = oq["tensor_storage"].begin(); it != oq["tensor_storage"].end(); ++it) {
        const auto& m = it.value();
        const auto r = ref_kinds.find(module_kind(it.key()));
        ASSERT_NE(r, ref_kinds.end()) << it.key() << " has no counterpart in the reference's tensor_storage";
        EXPECT_EQ(keys(m), keys(r->second)) << it.key();
        if (!m.contains("quant_format")) continue;
        ++compared;
        EXPECT_EQ(m["quant_format"], r->second["quant_format"]);
        EXPECT_EQ(m["mul1_multiplier"], r->second["mul1_multiplier"]);
        auto leaves = [](const nlohmann::json& st) {
            std::map<std::string, std::pair<std::string, size_t>> out;  // suffix -> (dtype, rank)
            for (auto t = st.begin(); t != st.end(); ++t)
                out[t.key().substr(t.key().rfind('.') + 1)] = {t.value()["dtype"].get<std::string>(),
                                                               t.value()["shape"].size()};
            return out;
        };
        EXPECT_EQ(leaves(m["stored_tensors"]), leaves(r->second["stored_tensors"])) << it.key();
    }
    EXPECT_EQ(compared, kLayers * 7 + 1);
    std::printf("layout: %d quantized modules match the reference file's tensor_storage entries\n", compared);
}

// The default calibration's size (convert.h): at least kCalibMinTokens (a Hessian has to generalise to text it was not
// computed on: issue 43), 4 tokens per input of the widest linear above that, at most 131072, rows of 512 tokens.
TEST(Convert, DefaultCalibrationSizes) {
    auto size = [](int max_in) {
        const CalibrationSize c = default_calibration(max_in);
        return std::make_pair(c.rows, c.cols);
    };
    EXPECT_EQ(size(64), std::make_pair(128, 512));       // tiny shapes: the floor
    EXPECT_EQ(size(1024), std::make_pair(128, 512));     // tiny-target
    EXPECT_EQ(size(8192), std::make_pair(128, 512));     // Llama-3.2-1B
    EXPECT_EQ(size(14336), std::make_pair(128, 512));    // Llama-3-8B (57344 tokens by the rule: the floor)
    EXPECT_EQ(size(20000), std::make_pair(157, 512));    // above the floor: 4 tokens an input
    EXPECT_EQ(size(28672), std::make_pair(224, 512));    // Llama-3-70B
    EXPECT_EQ(size(1 << 20), std::make_pair(256, 512));  // the cap
    for (int in : {1, 100, 5000, 20000, 50000}) {
        const CalibrationSize c = default_calibration(in);
        EXPECT_GE(c.rows * c.cols, kCalibMinTokens) << in;
        EXPECT_LE(c.rows * c.cols, 131072) << in;
    }
}

// A Llama layer's linears for the memory estimate: q, k, v on the attention input, o, gate and up on the MLP input,
// down (the Hessian ids as check_budgets gives them: one per input).
MemoryShape llama_shape(int layers, int hidden, int kv, int inter, int vocab) {
    MemoryShape s;
    for (int i = 0; i < layers; ++i)
        s.layers.push_back({{hidden, hidden, 0}, {hidden, kv, 0}, {hidden, kv, 0}, {hidden, hidden, 1},
                            {hidden, inter, 2}, {hidden, inter, 2}, {inter, hidden, 3}});
    s.head = {hidden, vocab, 0};
    s.hidden = hidden;
    s.intermediate = inter;
    const CalibrationSize c = default_calibration(std::max(hidden, inter));
    s.calibration_tokens = static_cast<int64_t>(c.rows) * c.cols;
    s.calibration_cols = c.cols;
    s.embed_bytes = static_cast<int64_t>(vocab) * hidden * 2;  // bf16, copied as it is
    s.shard_bytes = ConvertOptions{}.shard_bytes;
    return s;
}

// The GPU estimate against the converter's peaks measured on the H100 (scripts/device_convert.sh, 4.0 bpw, defaults,
// docs/conversion.md): Llama-3.2-1B 7.09 GiB, Llama-3-8B 14.17 GiB, Llama-3-70B 28.65 GiB. lm_head's quantizer (a
// 128k vocabulary) is the peak of all three, so a 24 GiB budget refuses a 70B up front, naming it, instead of
// failing at the head after the layers.
TEST(Convert, MemoryEstimateMatchesMeasuredPeaks) {
    const double gib = 1073741824.0;
    // Measured on an H100 (scripts/device_convert.sh 1b 70b-24): the whole 1B with no budget; the 70B's first two
    // layers and its full-size head under --gpu-memory 24 (one quantizer on the layers). The measured figure is what
    // the converter prints, the GPU quantizers' arrays and the Hessians (gpu_bytes_peak): at every size lm_head's.
    struct Case {
        const char* name;
        MemoryShape s;
        double gpu_gb;
        double measured_gib;
    };
    const Case cases[] = {{"1b", llama_shape(16, 2048, 512, 8192, 128256), 0, 3.65},
                          {"70b", llama_shape(80, 8192, 1024, 28672, 128256), 24, 14.71}};
    for (const Case& c : cases) {
        auto p = plan_memory(c.s, true, 0, c.gpu_gb);
        ASSERT_TRUE(p.is_ok()) << p.status().to_string();
        EXPECT_NEAR(p->gpu_head_bytes / gib, c.measured_gib, 0.06 * c.measured_gib) << c.name;
        std::printf("%s: estimated GPU peak %.2f GiB (layers %.2f with %d quantizers, lm_head %.2f), measured %.2f; "
                    "host %.2f GiB\n",
                    c.name, p->gpu_bytes() / gib, p->gpu_layer_bytes / gib, p->gpu_workers, p->gpu_head_bytes / gib,
                    c.measured_gib, p->host_bytes / gib);
    }
    // The asymmetric calibration (the default since): the same 1B measured 4.14 GiB on the GPU (the head's quantizer,
    // the last chunk's kept inputs and the shift's staging) and 4.10 GiB of host memory (the unquantized model's state
    // beside the calibration's).
    MemoryShape a1b = cases[0].s;
    a1b.asym = true;
    auto pa = plan_memory(a1b, true, 0, 0);
    ASSERT_TRUE(pa.is_ok());
    std::printf("1b with asym: estimated GPU head %.2f GiB, measured 4.14; host %.2f GiB, measured 4.10\n",
                pa->gpu_head_bytes / gib, pa->host_bytes / gib);
    EXPECT_NEAR(pa->gpu_head_bytes / gib, 4.14, 0.06 * 4.14);
    EXPECT_GE(pa->host_bytes / gib, 0.95 * 4.10);
    EXPECT_LE(pa->host_bytes / gib, 1.2 * 4.10);
    const MemoryShape& s70 = cases[1].s;
    EXPECT_EQ(plan_memory(s70, true, 0, 0)->gpu_workers, 2);  // no budget: two quantizers side by side
    // --gpu-memory 24 on a 70B: one quantizer on the layers, the head's quantizer within it too.
    auto b24 = plan_memory(s70, true, 64, 24);
    ASSERT_TRUE(b24.is_ok()) << b24.status().to_string();
    EXPECT_EQ(b24->gpu_workers, 1);
    EXPECT_GE(b24->gpu_head_bytes, 12 * gib);  // the head's quantizer still is most of it (14.71 GiB measured)
    // With the asymmetric calibration (the default) too: its shifts, its targets' products and a chunk's kept inputs
    // still leave the 70B's layers within 24 GiB on one quantizer (estimated 22.0 GiB; not measured on the GPU yet).
    MemoryShape a70 = s70;
    a70.asym = true;
    auto pa70 = plan_memory(a70, true, 64, 24);
    ASSERT_TRUE(pa70.is_ok()) << pa70.status().to_string();
    EXPECT_EQ(pa70->gpu_workers, 1);
    EXPECT_GT(pa70->gpu_layer_bytes, b24->gpu_layer_bytes);
    // Where the head is the peak, a budget below it is refused up front, naming lm_head.
    auto b3 = plan_memory(cases[0].s, true, 0, 3);
    ASSERT_FALSE(b3.is_ok());
    EXPECT_NE(b3.status().message().find("lm_head"), std::string::npos) << b3.status().message();
    // The host estimate against the peaks measured (sampled after every layer and the head; 4.0 bpw, defaults,
    // docs/conversion.md): the whole 1B 3.63 GiB and 8B 9.20 GiB (H100, their outputs in one shard), the 70B's first
    // two layers and full-size head 14.86 GiB. The estimate counts the moments between samples too (a layer's
    // forward holds the state a third time), so it may be above, not below.
    const struct {
        const char* name;
        MemoryShape s;
        double measured_gib;
    } host[] = {{"1b", cases[0].s, 3.63},
                {"8b", llama_shape(32, 4096, 1024, 14336, 128256), 9.20},
                {"70b, 2 layers", llama_shape(2, 8192, 1024, 28672, 128256), 14.86}};
    for (const auto& h : host) {
        const double est = plan_memory(h.s, true, 0, 0)->host_bytes / gib;
        std::printf("%s: host estimate %.2f GiB, measured %.2f\n", h.name, est, h.measured_gib);
        EXPECT_GE(est, 0.95 * h.measured_gib) << h.name;
        EXPECT_LE(est, 1.2 * h.measured_gib) << h.name;
    }
    // The whole 70B: its output (~36 GB at 4.0 bpw) goes to disk a shard at a time, so the host holds the
    // calibration state, a layer and one shard: within 64 GiB, not 4; held whole it would not be.
    EXPECT_LE(b24->host_bytes, 32 * gib);
    EXPECT_FALSE(plan_memory(s70, false, 4, 0).is_ok());
    MemoryShape whole = s70;
    whole.shard_bytes = 0;
    whole.bpw = 8.0;
    EXPECT_GT(plan_memory(whole, true, 0, 0)->host_bytes, 64 * gib);
    // o_proj reads its own Hessian: a layer's Hessians are counted once per input, not once per width.
    MemoryShape shared = llama_shape(1, 1024, 256, 4096, 1000), merged = shared;
    for (auto& l : merged.layers[0]) if (l.hessian == 1) l.hessian = 0;
    EXPECT_GT(plan_memory(shared, true, 0, 0)->gpu_layer_bytes, plan_memory(merged, true, 0, 0)->gpu_layer_bytes);
}

TEST(Convert, RandomModelAt4BpwLoadsAndMatches) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_test_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf");
    ThreadPool pool(2);
    ConvertOptions o;
    o.input_dir = base + "/hf";
    o.output_dir = base + "/q40";
    o.bpw = 4.0;
    o.calibration_rows = 4;
    o.calibration_cols = 64;
    o.sensitivity_tiles = 4;
    auto r = convert_model(o, pool);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    std::printf("4.0 bpw: converted in %.1f s, achieved %.4f bpw\n", r->seconds, r->achieved_bpw);
    EXPECT_NEAR(r->achieved_bpw, 4.0, 1e-9);
    auto sum = quant::summarize_exl3_model(o.output_dir);
    ASSERT_TRUE(sum.is_ok()) << sum.status().message();
    EXPECT_EQ(sum->tensors.size(), static_cast<size_t>(kLayers * 7 + 1));
    EXPECT_NEAR(sum->decoder_bpw, 4.0, 1e-9);
    EXPECT_TRUE(fs::exists(o.output_dir + "/tokenizer_config.json"));
    // Per tensor, the sanity window the reference implementation's own 4 bpw files are held to in
    // tests/quant (0.074-0.091 measured there on real weights; here LDLQ minimises the Hessian-weighted error, so
    // the plain Frobenius error of random weights under random calibration lands a little higher: 0.084-0.099).
    auto errs = quant::measure_exl3_error(o.output_dir, o.input_dir, pool);
    ASSERT_TRUE(errs.is_ok()) << errs.status().message();
    for (const auto& e : *errs) {
        std::printf("  %-40s K=%d rel error %.4f\n", e.name.c_str(), e.K, e.rel_error);
        if (e.K == 4) {
            EXPECT_LT(e.rel_error, 0.12) << e.name;
        }
    }

    // The layout ExLlamaV3 reads, against the reference implementation's own file: ../shared's, else its cut in the
    // extract, which keeps the config and every tensor_storage entry's keys, dtypes and ranks.
    const auto ref = test::exl3_pair();
    ASSERT_TRUE(ref.has_value()) << "neither ../shared nor the unpacked extract has the reference EXL3 file";
    expect_same_layout(o.output_dir, ref->exl3);

    std::vector<int32_t> toks;
    std::mt19937 rng(11);
    for (int i = 0; i < 32; ++i) toks.push_back(static_cast<int32_t>(rng() % kVocab));
    auto a = logits_of(o.input_dir, toks), b = logits_of(o.output_dir, toks);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    const double rel = test::relative_rms(a, b);
    std::printf("4.0 bpw logits relative error vs original: %.4f\n", rel);
    EXPECT_LT(rel, 0.3);  // random 2-layer model, measured 0.18 (per-tensor K=4 error ~0.07-0.09, compounding)

    // The same model as a Phi-3 checkpoint (q|k|v and gate|up fused): the converter quantizes the parts and writes
    // them under the names the reference implementation uses for Phi-3 (q_proj ... up_proj), so the file is the
    // Llama one byte for byte.
    write_model(base + "/phi3", false, "", /*fused=*/true);
    ConvertOptions of = o;
    of.input_dir = base + "/phi3";
    of.output_dir = base + "/q40_phi3";
    auto rf = convert_model(of, pool);
    ASSERT_TRUE(rf.is_ok()) << rf.status().message();
    EXPECT_EQ(test::read_file(of.output_dir + "/model.safetensors"), test::read_file(o.output_dir + "/model.safetensors"));
    auto store = exl3::TensorStore::open_dir(of.output_dir);
    ASSERT_TRUE(store.is_ok());
    EXPECT_TRUE(store->contains("model.layers.1.self_attn.k_proj.trellis"));
    EXPECT_TRUE(store->contains("model.layers.1.mlp.up_proj.trellis"));
    EXPECT_FALSE(store->contains("model.layers.1.self_attn.qkv_proj.trellis"));

    // Fractional: K mixes 3 and 4 to land at (or just under) 3.5.
    o.output_dir = base + "/q35";
    o.bpw = 3.5;
    auto r2 = convert_model(o, pool);
    ASSERT_TRUE(r2.is_ok()) << r2.status().message();
    auto sum2 = quant::summarize_exl3_model(o.output_dir);
    ASSERT_TRUE(sum2.is_ok());
    std::printf("3.5 bpw: converted in %.1f s, achieved %.4f bpw (reader's count %.4f)\n", r2->seconds,
                r2->achieved_bpw, sum2->decoder_bpw);
    EXPECT_NEAR(sum2->decoder_bpw, r2->achieved_bpw, 1e-9);
    EXPECT_LE(sum2->decoder_bpw, 3.5 + 1e-9);
    EXPECT_GT(sum2->decoder_bpw, 3.3);
    fs::remove_all(base);
}

// A Phi-3 checkpoint (q|k|v and gate|up fused) holds the same model as the split Llama checkpoint of the same values:
// the loader's views of the fused rows are exactly the parts.
TEST(Convert, FusedCheckpointLoadsAsItsParts) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_fused_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/phi3", false, "", /*fused=*/true);
    write_model(base + "/llama");
    std::vector<int32_t> toks;
    std::mt19937 rng(5);
    for (int i = 0; i < 24; ++i) toks.push_back(static_cast<int32_t>(rng() % kVocab));
    const auto split = logits_of(base + "/llama", toks), fused = logits_of(base + "/phi3", toks);
    ASSERT_FALSE(fused.empty());
    EXPECT_EQ(fused, split);
    fs::remove_all(base);
}

TEST(Convert, BadInputStopsCleanly) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_bad_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf", /*poison=*/true);
    ThreadPool pool(2);
    ConvertOptions o;
    o.input_dir = base + "/hf";
    o.output_dir = base + "/out";
    o.calibration_rows = 2;
    o.calibration_cols = 16;
    auto r = convert_model(o, pool);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("non-finite"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("model.layers.1.mlp.down_proj.weight"), std::string::npos)
        << r.status().message();
    EXPECT_FALSE(fs::exists(o.output_dir));
    for (const auto& e : fs::directory_iterator(base)) EXPECT_EQ(e.path().filename(), "hf");  // no temp left

    // Unsupported architecture.
    std::ofstream(base + "/hf/config.json") << R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})";
    auto r2 = convert_model(o, pool);
    ASSERT_FALSE(r2.is_ok());
    std::printf("unsupported: %s\n", r2.status().message().c_str());
    EXPECT_FALSE(fs::exists(o.output_dir));
    fs::remove_all(base);
}

// A conversion of write_model's checkpoint under base/hf into base/out with a small calibration (a token one by
// default) and no progress bar.
ConvertOptions small_options(const std::string& base, int rows = 2, int cols = 16) {
    ConvertOptions o;
    o.input_dir = base + "/hf";
    o.output_dir = base + "/out";
    o.calibration_rows = rows;
    o.calibration_cols = cols;
    o.progress = false;
    return o;
}

TEST(Convert, MissingTensorStopsCleanly) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_missing_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf", false, "model.layers.1.self_attn.v_proj.weight");
    ThreadPool pool(2);
    const ConvertOptions o = small_options(base);
    auto r = convert_model(o, pool);
    ASSERT_FALSE(r.is_ok());
    std::printf("missing: %s\n", r.status().message().c_str());
    EXPECT_NE(r.status().message().find("model.layers.1.self_attn.v_proj.weight"), std::string::npos);
    EXPECT_FALSE(fs::exists(o.output_dir));
    for (const auto& e : fs::directory_iterator(base)) EXPECT_EQ(e.path().filename(), "hf");
    fs::remove_all(base);
}

// A host budget the estimate exceeds is refused before any work, naming the flag; the output never appears.
TEST(Convert, BudgetTooSmallStopsCleanly) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_budget_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf", false);
    ThreadPool pool(2);
    ConvertOptions o = small_options(base);
    o.host_memory_gb = 1e-6;
    auto r = convert_model(o, pool);
    ASSERT_FALSE(r.is_ok());
    std::printf("budget: %s\n", r.status().message().c_str());
    EXPECT_NE(r.status().message().find("--host-memory"), std::string::npos);
    EXPECT_FALSE(fs::exists(o.output_dir));
    fs::remove_all(base);
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Interrupted after layer 0 (the test hook fails the run right after the layer is committed to the work dir), then
// rerun with the same options: the result must be byte-identical to an uninterrupted conversion.
TEST(Convert, ResumesFromWorkDirByteIdentical) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_resume_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf");
    ThreadPool pool(2);
    ConvertOptions o;
    o.input_dir = base + "/hf";
    o.bpw = 3.5;  // mixed K: the allocation must be restored too
    o.calibration_rows = 4;
    o.calibration_cols = 32;
    o.sensitivity_tiles = 4;
    o.progress = false;

    o.output_dir = base + "/straight";
    auto ref = convert_model(o, pool);
    ASSERT_TRUE(ref.is_ok()) << ref.status().message();

    o.output_dir = base + "/resumed";
    o.work_dir = base + "/work";
    o.stop_after_layer = 0;
    auto r1 = convert_model(o, pool);
    ASSERT_FALSE(r1.is_ok());
    EXPECT_NE(r1.status().message().find("stopped after layer 0"), std::string::npos) << r1.status().message();
    EXPECT_FALSE(fs::exists(o.output_dir));  // a clean stop: no output, no temp dir
    EXPECT_TRUE(fs::exists(o.work_dir + "/layer_000.safetensors"));
    EXPECT_FALSE(fs::exists(o.work_dir + "/layer_001.safetensors"));

    // Other options against that work dir: refused, naming what differs.
    ConvertOptions other = o;
    other.bpw = 4.0;
    other.stop_after_layer = -1;
    auto bad = convert_model(other, pool);
    ASSERT_FALSE(bad.is_ok());
    std::printf("mismatch: %s\n", bad.status().message().c_str());
    EXPECT_NE(bad.status().message().find("bits"), std::string::npos) << bad.status().message();
    EXPECT_FALSE(fs::exists(other.output_dir));

    o.stop_after_layer = -1;
    auto r2 = convert_model(o, pool);
    ASSERT_TRUE(r2.is_ok()) << r2.status().message();
    EXPECT_EQ(r2->resumed_layers, 1);
    EXPECT_EQ(r2->achieved_bpw, ref->achieved_bpw);
    EXPECT_FALSE(fs::exists(o.work_dir)) << "the work dir is removed after success";
    for (const char* f : {"model.safetensors", "config.json", "quantization_config.json"}) {
        const std::string a = slurp(base + "/straight/" + f), b = slurp(base + "/resumed/" + f);
        EXPECT_FALSE(a.empty()) << f;
        EXPECT_TRUE(a == b) << f << " differs between the uninterrupted and the resumed conversion";
    }
    fs::remove_all(base);
}

// Whether tensor n holds the same bytes in both checkpoints.
bool same_bytes(const TensorStore& a, const TensorStore& b, const std::string& n) {
    auto x = a.get(n), y = b.get(n);
    return x.is_ok() && y.is_ok() && x->nbytes() == y->nbytes() && std::memcmp(x->data, y->data, x->nbytes()) == 0;
}

// Each converted model's relative logit error against the unquantized one, on 32 fixed random tokens.
std::vector<double> logit_errors(const std::string& original, const std::vector<std::string>& converted) {
    std::vector<int32_t> toks;
    std::mt19937 rng(5);
    for (int i = 0; i < 32; ++i) toks.push_back(static_cast<int32_t>(rng() % kVocab));
    const auto ref = logits_of(original, toks);
    std::vector<double> e;
    for (const std::string& d : converted) e.push_back(test::relative_rms(ref, logits_of(d, toks)));
    return e;
}

// The recipe's `sequential` step: a layer's stages (q/k/v, o, gate/up, down) each calibrated through the stages before
// it already quantized. The first stage reads the layer's input either way, so layer 0's q/k/v are the default's byte
// for byte; o, gate/up and down see the quantized stages' outputs and differ; the file loads and stays as close to
// the original model as the default's.
TEST(Convert, SequentialStagesCalibrateThroughTheQuantizedOnes) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_seq_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf");
    ThreadPool pool(2);
    ConvertOptions o = small_options(base, 4, 64);
    o.bpw = 2.0;
    o.recipe.asym = 0;  // the default's asym does not combine with sequential
    o.output_dir = base + "/default";
    ASSERT_TRUE(convert_model(o, pool).is_ok());
    o.recipe.sequential = true;
    o.output_dir = base + "/sequential";
    auto r = convert_model(o, pool);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    auto a = TensorStore::open_dir(base + "/default"), b = TensorStore::open_dir(o.output_dir);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    auto same = [&](const std::string& n) { return same_bytes(*a, *b, n); };
    for (const char* t : {"q_proj", "k_proj", "v_proj"})
        EXPECT_TRUE(same(fmt::format("model.layers.0.self_attn.{}.trellis", t))) << t;
    EXPECT_FALSE(same("model.layers.0.self_attn.o_proj.trellis"));
    for (const char* t : {"gate_proj", "up_proj", "down_proj"})
        EXPECT_FALSE(same(fmt::format("model.layers.0.mlp.{}.trellis", t))) << t;

    const std::vector<double> e = logit_errors(o.input_dir, {base + "/default", o.output_dir});
    const double e_def = e[0], e_seq = e[1];
    std::printf("2.0 bpw logits relative error: default %.4f, sequential %.4f\n", e_def, e_seq);
    EXPECT_LT(e_seq, 1.25 * e_def);
    fs::remove_all(base);
}

// The recipe's `asym` step: each linear quantized toward the unquantized model's output on the quantized path's
// inputs. Layer 0 reads the same inputs on both paths (nothing before it is quantized), so its tensors are the
// default's byte for byte; layer 1's and the head's differ, the file loads and is at least as close to the model. It
// refuses `sequential` beside it, and a run interrupted after layer 0 resumes (both states in the work dir) to the
// same bytes.
TEST(Convert, AsymCalibrationCorrectsTheLayersAfterTheFirst) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_asym_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf");
    ThreadPool pool(2);
    // 1024 calibration tokens, 4 a dimension of the widest input: with fewer the shift's regression fits the sample
    // (4 x 64 tokens: 0.684 against the default's 0.649 at weight 0.5; 16 x 64: 0.518 against 0.569, 1.0 0.560).
    ConvertOptions o = small_options(base, 16, 64);
    o.bpw = 2.0;
    o.recipe.asym = 0;
    o.output_dir = base + "/default";
    ASSERT_TRUE(convert_model(o, pool).is_ok());
    o.recipe.asym = 0.5;
    o.output_dir = base + "/asym";
    auto r = convert_model(o, pool);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    auto a = TensorStore::open_dir(base + "/default"), b = TensorStore::open_dir(o.output_dir);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    auto same = [&](const std::string& n) { return same_bytes(*a, *b, n); };
    for (const char* t : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
        EXPECT_TRUE(same(fmt::format("model.layers.0.{}.trellis", t))) << t;
        EXPECT_FALSE(same(fmt::format("model.layers.1.{}.trellis", t))) << t;
    }
    EXPECT_FALSE(same("lm_head.trellis"));

    const std::vector<double> e = logit_errors(o.input_dir, {base + "/default", o.output_dir});
    const double e_def = e[0], e_asym = e[1];
    std::printf("2.0 bpw logits relative error: without asym %.4f, asym 0.5 %.4f\n", e_def, e_asym);
    EXPECT_LT(e_asym, e_def);

    ConvertOptions both = o;
    both.recipe.sequential = true;
    both.output_dir = base + "/both";
    auto refused = convert_model(both, pool);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_NE(refused.status().message().find("sequential"), std::string::npos) << refused.status().message();

    o.output_dir = base + "/resumed";
    o.work_dir = base + "/work";
    o.stop_after_layer = 0;
    ASSERT_FALSE(convert_model(o, pool).is_ok());
    o.stop_after_layer = -1;
    auto r2 = convert_model(o, pool);
    ASSERT_TRUE(r2.is_ok()) << r2.status().message();
    EXPECT_EQ(r2->resumed_layers, 1);
    EXPECT_EQ(slurp(base + "/asym/model.safetensors"), slurp(base + "/resumed/model.safetensors"));
    fs::remove_all(base);
}

// The output goes to disk a shard at a time as the layers finish (host memory holds one shard, not a 70B's 36 GB):
// small shards give model-0000i-of-0000n.safetensors and the index Hugging Face writes, the same tensors byte for byte
// as the one file, the same configs and logits; a run resumed from its work dir writes the same shards.
TEST(Convert, WritesShardsAsTheLayersFinish) {
    const std::string base = fs::temp_directory_path() / ("exl3_convert_shards_" + std::to_string(::getpid()));
    fs::remove_all(base);
    write_model(base + "/hf");
    ThreadPool pool(2);
    ConvertOptions o = small_options(base, 4, 32);
    o.sensitivity_tiles = 4;
    o.output_dir = base + "/one";
    ASSERT_TRUE(convert_model(o, pool).is_ok());
    EXPECT_TRUE(fs::exists(o.output_dir + "/model.safetensors"));
    EXPECT_FALSE(fs::exists(o.output_dir + "/model.safetensors.index.json"));

    o.shard_bytes = 32 << 10;  // the embedding (128 KiB of fp32) fills the first; a shard a layer after it
    o.output_dir = base + "/shards";
    ASSERT_TRUE(convert_model(o, pool).is_ok());
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(o.output_dir))
        if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    ASSERT_EQ(files.size(), 3u);
    EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
    EXPECT_EQ(files[2], "model-00003-of-00003.safetensors");
    const auto index = nlohmann::json::parse(slurp(o.output_dir + "/model.safetensors.index.json"));
    EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00003.safetensors");
    EXPECT_EQ(index["weight_map"]["model.layers.1.mlp.down_proj.trellis"], "model-00002-of-00003.safetensors");
    EXPECT_EQ(index["weight_map"]["lm_head.trellis"], "model-00003-of-00003.safetensors");
    auto one = TensorStore::open_dir(base + "/one"), shards = TensorStore::open_dir(o.output_dir);
    ASSERT_TRUE(one.is_ok() && shards.is_ok()) << shards.status().message();
    auto names = one->names(), shard_names = shards->names();
    std::sort(names.begin(), names.end());
    std::sort(shard_names.begin(), shard_names.end());
    ASSERT_EQ(names, shard_names);
    int64_t total = 0;
    for (const std::string& n : names) {
        auto a = one->get(n), b = shards->get(n);
        ASSERT_TRUE(a.is_ok() && b.is_ok()) << n;
        ASSERT_EQ(a->nbytes(), b->nbytes()) << n;
        EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes()), 0) << n;
        total += static_cast<int64_t>(a->nbytes());
    }
    EXPECT_EQ(index["metadata"]["total_size"], total);
    for (const char* f : {"config.json", "quantization_config.json"})
        EXPECT_EQ(slurp(base + "/one/" + f), slurp(o.output_dir + "/" + f)) << f;
    std::vector<int32_t> toks = {1, 5, 9, 200, 17, 3, 77, 128};
    EXPECT_EQ(logits_of(base + "/one", toks), logits_of(o.output_dir, toks));

    // Stopped after layer 0 and resumed: the restored layer's tensors fill their shard as before.
    o.output_dir = base + "/resumed";
    o.work_dir = base + "/work";
    o.stop_after_layer = 0;
    ASSERT_FALSE(convert_model(o, pool).is_ok());
    o.stop_after_layer = -1;
    auto r = convert_model(o, pool);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->resumed_layers, 1);
    for (const std::string& f : files)
        EXPECT_TRUE(slurp(base + "/shards/" + f) == slurp(o.output_dir + "/" + f)) << f;
    EXPECT_EQ(slurp(base + "/shards/model.safetensors.index.json"),
              slurp(o.output_dir + "/model.safetensors.index.json"));

    o.shard_bytes = 0;  // refused up front
    o.work_dir.clear();
    o.output_dir = base + "/zero";
    auto z = convert_model(o, pool);
    ASSERT_FALSE(z.is_ok());
    EXPECT_NE(z.status().message().find("shard"), std::string::npos) << z.status().message();
    fs::remove_all(base);
}
}  // namespace
}  // namespace exl3::convert
