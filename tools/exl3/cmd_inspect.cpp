// exl3 inspect: what a model directory holds, for people (text) and scripts (--json). For EXL3 checkpoints also the
// quantization: bits per weight of the decoder linears and of the head, K and codebook per tensor.
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "exl3/devices.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "quant/exl3_model.h"
#include "tools/exl3/commands.h"

namespace exl3::cli {

namespace {

struct InspectOptions {
    std::string dir;
    bool json = false;
    bool tensors = false;
    bool devices = false;
    // --memory: the GPU memory plan (Model::plan_memory) for these load options.
    bool memory = false;
    std::string device = "cuda";
    int context = 0;
    KvBitsFlags kv_bits;
};

nlohmann::json plan_json(const MemoryPlan& p) {
    auto items = [](const std::vector<MemoryItem>& v) {
        nlohmann::json a = nlohmann::json::array();
        for (const auto& i : v) a.push_back({{"name", i.name}, {"detail", i.detail}, {"bytes", i.bytes}});
        return a;
    };
    return {{"device", p.device},
            {"device_name", p.device_name},
            {"device_total", p.device_total},
            {"device_free", p.device_free},
            {"budget", p.budget},
            {"budget_given", p.budget_given},
            {"gpu", items(p.gpu)},
            {"host", items(p.host)},
            {"gpu_total", p.gpu_total()},
            {"context_length", p.context_length},
            {"context_shortened", p.context_shortened},
            {"cache_tokens", p.cache_tokens},
            {"page_size", p.page_size},
            {"kv_bits_k", p.kv_bits_k},
            {"kv_bits_v", p.kv_bits_v},
            {"kv_bytes_per_token", p.kv_bytes_per_token},
            {"max_step_tokens", p.max_step_tokens},
            {"offload_layers", p.offload_layers},
            {"offload_mode", p.offload_mode == OffloadMode::kCpu ? "cpu" : "stream"},
            {"offload_expert_layers", p.offload_expert_layers},
            {"embed_on_gpu", p.embed_on_gpu},
            {"fits", p.fits},
            {"short_by", p.short_by},
            {"suggestions", p.suggestions}};
}

// exl3 inspect --memory: the plan Model::load would make, printed before (and without) any allocation. Exit code 0
// when it fits, 1 when it does not (the refusal on stderr too).
int memory(const InspectOptions& o) {
    LoadOptions lo;
    lo.device = o.device == "cpu" ? "cuda" : o.device;
    lo.context_length = o.context;
    o.kv_bits.apply(lo);
    auto plan = Model::plan_memory(o.dir, lo);
    if (!plan.is_ok()) return fail("inspect", plan.status().to_string());
    if (o.json)
        std::printf("%s\n", plan_json(*plan).dump(2).c_str());
    else
        std::printf("%s", plan->table().c_str());
    if (plan->fits) return 0;
    return fail("inspect", "the model does not fit: " + plan->refusal());
}

int devices(bool as_json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& d : list_devices()) {
        Status st = device_self_test(d.index);
        out.push_back({{"index", d.index},
                       {"name", d.name},
                       {"sm", d.sm_major * 10 + d.sm_minor},
                       {"memory_bytes", d.total_memory},
                       {"multiprocessors", d.multiprocessors},
                       {"self_test", st.is_ok() ? "ok" : st.message()}});
    }
    if (as_json) {
        std::printf("%s\n", out.dump(2).c_str());
    } else if (out.empty()) {
        std::printf("no CUDA devices%s\n", built_with_cuda() ? "" : " (this build has no CUDA backend)");
    } else {
        for (const auto& d : out)
            std::printf("cuda:%d  %s  sm_%d  %.1f GiB  %d SMs  self-test: %s\n", d["index"].get<int>(),
                        d["name"].get<std::string>().c_str(), d["sm"].get<int>(),
                        d["memory_bytes"].get<double>() / (1 << 30), d["multiprocessors"].get<int>(),
                        d["self_test"].get<std::string>().c_str());
    }
    return 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "6" for whole numbers of bits, "4.25" otherwise.
std::string bits_label(double bpw) {
    if (std::fabs(bpw - std::round(bpw)) < 1e-9) return std::to_string(static_cast<int>(std::round(bpw)));
    char b[32];
    std::snprintf(b, sizeof b, "%.2f", bpw);
    return b;
}

// The "quantization" object of the JSON output, from quant::summarize_exl3_model.
nlohmann::json exl3_json(const quant::Exl3ModelSummary& s) {
    std::map<int, int> k_count;
    std::set<std::string> codebooks;
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : s.tensors) {
        if (!t.is_head) ++k_count[t.K];
        codebooks.insert(std::string(quant::codebook_name(t.codebook)));
        tensors.push_back({{"name", t.name},
                           {"K", t.K},
                           {"codebook", std::string(quant::codebook_name(t.codebook))},
                           {"k_pad", t.k_pad},
                           {"n_pad", t.n_pad},
                           {"head", t.is_head},
                           {"bias", t.has_bias},
                           {"legacy_signs", t.legacy_signs},
                           {"bpw_with_scales", t.bpw_with_scales()}});
    }
    nlohmann::json ks = nlohmann::json::object();
    for (const auto& [k, n] : k_count) ks[std::to_string(k)] = n;
    const quant::Exl3QuantConfig& c = s.config;
    nlohmann::json j = {{"method", "exl3"},
                        {"version", c.version},
                        {"codebooks", std::vector<std::string>(codebooks.begin(), codebooks.end())},
                        {"decoder_bpw", s.decoder_bpw},
                        {"decoder_bpw_with_scales", s.decoder_bpw_with_scales},
                        {"head_bpw", s.head_bpw},
                        {"decoder_weights", s.decoder_weights},
                        {"quantized_tensors", s.tensors.size()},
                        {"decoder_tensors_by_K", ks},
                        {"out_scales", c.out_scales},
                        {"notes", s.notes},
                        {"tensors", tensors}};
    j["declared_bits"] = c.bits ? nlohmann::json(*c.bits) : nlohmann::json(nullptr);
    j["declared_head_bits"] = c.head_bits ? nlohmann::json(*c.head_bits) : nlohmann::json(nullptr);
    j["declared_codebook"] =
        c.codebook ? nlohmann::json(std::string(quant::codebook_name(*c.codebook))) : nlohmann::json(nullptr);
    return j;
}

int inspect(const InspectOptions& o) {
    if (o.devices) return devices(o.json);
    if (o.dir.empty()) return fail("inspect", "give a model directory (or --devices)");
    if (o.memory) return memory(o);
    auto cfg = load_model_config(o.dir);
    if (!cfg.is_ok()) return fail("inspect", cfg.status().to_string());
    auto store = TensorStore::open_dir(o.dir);
    if (!store.is_ok()) return fail("inspect", store.status().to_string());
    const ModelConfig& c = *cfg;

    // EXL3 when the checkpoint holds a trellis or declares a quantization_config; a broken one is an error.
    bool exl3 = quant::read_exl3_quant_config(o.dir).status().code() != StatusCode::kNotFound;
    for (const auto& name : store->names()) exl3 = exl3 || ends_with(name, ".trellis");
    std::optional<quant::Exl3ModelSummary> summary;
    std::set<std::string> quantized;  // prefixes of EXL3 linears
    if (exl3) {
        auto s = quant::summarize_exl3_model(o.dir);
        if (!s.is_ok()) return fail("inspect", s.status().to_string());
        summary = std::move(*s);
        for (const auto& t : summary->tensors) quantized.insert(t.name);
    }
    auto exl3_prefix = [&](const std::string& name) -> const std::string* {
        const size_t dot = name.rfind('.');
        if (dot == std::string::npos) return nullptr;
        auto it = quantized.find(name.substr(0, dot));
        return it == quantized.end() ? nullptr : &*it;
    };

    // Parameters: dense tensors by their elements, EXL3 linears by their (padded) weights; the suh/svh scales and
    // markers count only in bytes.
    int64_t params = 0, bytes = 0;
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& name : store->names()) {
        TensorView t = *store->get(name);
        bytes += static_cast<int64_t>(t.nbytes());
        if (exl3_prefix(name)) continue;
        params += t.numel();
        tensors.push_back({{"name", name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}});
    }
    if (summary)
        for (const auto& t : summary->tensors) params += t.weights();
    nlohmann::json j = {
        {"architecture", c.arch_name},
        {"format", summary ? "exl3" : "hf"},
        {"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"intermediate_size", c.intermediate_size},
        {"num_layers", c.num_layers},
        {"num_heads", c.num_heads},
        {"num_kv_heads", c.num_kv_heads},
        {"head_dim", c.head_dim},
        {"context_length", c.max_position_embeddings},
        {"rope", {{"type", rope_type_name(c.rope.type)}, {"theta", c.rope.theta}, {"factor", c.rope.factor}}},
        {"tie_word_embeddings", c.tie_word_embeddings},
        {"qkv_bias", c.qkv_bias},
        {"qk_norm", c.qk_norm != QkNorm::kNone},
        {"features", family_features(c)},
        {"sliding_window", c.sliding_window},
        {"dtype", std::string(dtype_name(c.dtype))},
        {"parameters", params},
        {"size_bytes", bytes},
        {"bits_per_weight", params ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0},
        {"eos_token_ids", c.eos_token_ids},
    };
    if (summary) {
        j["quantization"] = exl3_json(*summary);
        if (!o.tensors) j["quantization"].erase("tensors");
    }
    if (o.json) {
        if (o.tensors) j["tensors"] = tensors;
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("%s  (%s%s)\n", o.dir.c_str(), c.arch_name.c_str(), summary ? ", EXL3" : "");
    std::printf("  layers %d, hidden %d, intermediate %d, heads %d (kv %d) x %d, vocab %d\n", c.num_layers,
                c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size);
    std::printf("  context %d, rope %s (theta %g, factor %g)%s%s%s\n", c.max_position_embeddings,
                rope_type_name(c.rope.type), c.rope.theta, c.rope.factor, c.tie_word_embeddings ? ", tied head" : "",
                c.qkv_bias ? ", qkv bias" : "", c.qk_norm != QkNorm::kNone ? ", q/k norm" : "");
    if (!family_features(c).empty()) std::printf("  %s\n", family_features(c).c_str());
    std::printf("  %.2f M parameters, %.1f MiB, %.2f bits per weight (%s)\n", static_cast<double>(params) / 1e6,
                static_cast<double>(bytes) / (1 << 20), j["bits_per_weight"].get<double>(),
                summary ? "overall, EXL3 linears and unquantized tensors" : std::string(dtype_name(c.dtype)).c_str());
    if (summary) {
        const nlohmann::json& q = j["quantization"];
        std::string cbs, ks;
        for (const auto& cb : q["codebooks"]) cbs += (cbs.empty() ? "" : "+") + cb.get<std::string>();
        for (const auto& [k, n] : q["decoder_tensors_by_K"].items())
            ks += (ks.empty() ? "" : ", ") + std::to_string(n.get<int>()) + " at K=" + k;
        std::printf("  EXL3 %s: decoder %.2f bpw (%.2f with scales), head %s, codebook %s\n",
                    summary->config.version.empty() ? "(version unknown)" : summary->config.version.c_str(),
                    summary->decoder_bpw, summary->decoder_bpw_with_scales,
                    summary->head_bpw > 0 ? (bits_label(summary->head_bpw) + " bpw").c_str() : "unquantized",
                    cbs.c_str());
        std::string head_k;
        for (const auto& t : summary->tensors)
            if (t.is_head) head_k = ", head at K=" + std::to_string(t.K);
        std::printf("  %zu quantized linears: decoder %s%s\n", summary->tensors.size(), ks.c_str(), head_k.c_str());
        for (const auto& n : summary->notes) std::printf("  note: %s\n", n.c_str());
    }
    if (o.tensors) {
        for (const auto& t : tensors)
            std::printf("  %-56s %-5s %s\n", t["name"].get<std::string>().c_str(),
                        t["dtype"].get<std::string>().c_str(), t["shape"].dump().c_str());
        if (summary)
            for (const auto& t : summary->tensors)
                std::printf("  %-56s EXL3  K=%d %-5s [%d, %d] padded (k, n), %.2f bpw with scales%s%s\n",
                            t.name.c_str(), t.K, std::string(quant::codebook_name(t.codebook)).c_str(), t.k_pad,
                            t.n_pad, t.bpw_with_scales(), t.has_bias ? ", bias" : "",
                            t.legacy_signs ? ", legacy su/sv" : "");
    }
    return 0;
}

}  // namespace

Runner add_inspect(CLI::App& app) {
    auto o = std::make_shared<InspectOptions>();
    app.add_option("dir", o->dir, "model directory");
    app.add_flag("--json", o->json, "print one JSON object");
    app.add_flag("--tensors", o->tensors, "list every tensor");
    app.add_flag("--devices", o->devices, "list CUDA devices and run a self-test on each");
    app.add_flag("--memory", o->memory,
                 "the GPU memory plan of loading the model with the flags below (no GPU needed with --gpu-memory)");
    app.add_option("-d,--device", o->device, "--memory: cuda or cuda:N")->capture_default_str();
    app.add_option("-c,--context", o->context, "--memory: context length (0 = the model's)")
        ->check(CLI::NonNegativeNumber);
    add_kv_bits_options(app, o->kv_bits, true);
    return [o] { return inspect(*o); };
}

}  // namespace exl3::cli
