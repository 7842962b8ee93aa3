// exl3 inspect: what a model directory holds, for people (text) and scripts (--json).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "format/model_config.h"
#include "format/safetensors.h"
#include "tools/exl3/commands.h"
#ifdef EXL3_HAVE_CUDA
#include "backend/cuda/device.h"
#endif

namespace exl3::cli {

namespace {

struct InspectOptions {
    std::string dir;
    bool json = false;
    bool tensors = false;
    bool devices = false;
};

int devices(bool as_json) {
    nlohmann::json out = nlohmann::json::array();
#ifdef EXL3_HAVE_CUDA
    for (const auto& d : cuda::list_devices()) {
        Status st = cuda::self_test(d.index);
        out.push_back({{"index", d.index}, {"name", d.name}, {"sm", d.sm_major * 10 + d.sm_minor},
                       {"memory_bytes", d.total_memory}, {"multiprocessors", d.multiprocessors},
                       {"self_test", st.is_ok() ? "ok" : st.message()}});
    }
#endif
    if (as_json) {
        std::printf("%s\n", out.dump(2).c_str());
    } else if (out.empty()) {
        std::printf("no CUDA devices%s\n",
#ifdef EXL3_HAVE_CUDA
                    ""
#else
                    " (this build has no CUDA backend)"
#endif
        );
    } else {
        for (const auto& d : out)
            std::printf("cuda:%d  %s  sm_%d  %.1f GiB  %d SMs  self-test: %s\n", d["index"].get<int>(),
                        d["name"].get<std::string>().c_str(), d["sm"].get<int>(),
                        d["memory_bytes"].get<double>() / (1 << 30), d["multiprocessors"].get<int>(),
                        d["self_test"].get<std::string>().c_str());
    }
    return 0;
}

int inspect(const InspectOptions& o) {
    if (o.devices) return devices(o.json);
    if (o.dir.empty()) return fail("inspect", "give a model directory (or --devices)");
    auto cfg = load_model_config(o.dir);
    if (!cfg.is_ok()) return fail("inspect", cfg.status().to_string());
    auto store = TensorStore::open_dir(o.dir);
    if (!store.is_ok()) return fail("inspect", store.status().to_string());
    const ModelConfig& c = *cfg;
    int64_t params = 0, bytes = 0;
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& name : store->names()) {
        TensorView t = *store->get(name);
        params += t.numel();
        bytes += static_cast<int64_t>(t.nbytes());
        tensors.push_back({{"name", name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}});
    }
    nlohmann::json j = {
        {"architecture", c.arch_name},
        {"format", "hf"},
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
        {"qk_norm", c.qk_norm},
        {"sliding_window", c.sliding_window},
        {"dtype", std::string(dtype_name(c.dtype))},
        {"parameters", params},
        {"size_bytes", bytes},
        {"bits_per_weight", params ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0},
        {"eos_token_ids", c.eos_token_ids},
    };
    if (o.json) {
        if (o.tensors) j["tensors"] = tensors;
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("%s  (%s)\n", o.dir.c_str(), c.arch_name.c_str());
    std::printf("  layers %d, hidden %d, intermediate %d, heads %d (kv %d) x %d, vocab %d\n", c.num_layers,
                c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size);
    std::printf("  context %d, rope %s (theta %g, factor %g)%s%s%s\n", c.max_position_embeddings,
                rope_type_name(c.rope.type), c.rope.theta, c.rope.factor, c.tie_word_embeddings ? ", tied head" : "",
                c.qkv_bias ? ", qkv bias" : "", c.qk_norm ? ", q/k norm" : "");
    std::printf("  %.2f M parameters, %.1f MiB, %.2f bits per weight (%s)\n", static_cast<double>(params) / 1e6,
                static_cast<double>(bytes) / (1 << 20), j["bits_per_weight"].get<double>(),
                std::string(dtype_name(c.dtype)).c_str());
    if (o.tensors)
        for (const auto& t : tensors)
            std::printf("  %-56s %-5s %s\n", t["name"].get<std::string>().c_str(),
                        t["dtype"].get<std::string>().c_str(), t["shape"].dump().c_str());
    return 0;
}

}  // namespace

Runner add_inspect(CLI::App& app) {
    auto o = std::make_shared<InspectOptions>();
    app.add_option("dir", o->dir, "model directory");
    app.add_flag("--json", o->json, "print one JSON object");
    app.add_flag("--tensors", o->tensors, "list every tensor");
    app.add_flag("--devices", o->devices, "list CUDA devices and run a self-test on each");
    return [o] { return inspect(*o); };
}

}  // namespace exl3::cli
