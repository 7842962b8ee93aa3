#include "format/model_config.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/mmap.h"

namespace exl3 {

namespace {

using json = nlohmann::json;

// Typed field access with messages that name the file and the key.
class Fields {
public:
    Fields(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

    bool has(const char* key) const {
        auto it = j_.find(key);
        return it != j_.end() && !it->is_null();
    }
    bool present(const char* key) const { return j_.contains(key); }  // null included
    Status get_int(const char* key, int* out, bool required, int lo = 1, int hi = 1 << 30) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) {
            if (required) return invalid_argument(fmt::format("{}: missing required field '{}'", source_, key));
            return Status::ok();
        }
        if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()))
            return invalid_argument(fmt::format("{}: '{}' must be an integer", source_, key));
        double v = it->get<double>();
        if (v < lo || v > hi)
            return invalid_argument(fmt::format("{}: '{}' = {} is out of range [{}, {}]", source_, key, v, lo, hi));
        *out = static_cast<int>(v);
        return Status::ok();
    }
    Status get_double(const char* key, double* out, bool required = false) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) {
            if (required) return invalid_argument(fmt::format("{}: missing required field '{}'", source_, key));
            return Status::ok();
        }
        if (!it->is_number()) return invalid_argument(fmt::format("{}: '{}' must be a number", source_, key));
        *out = it->get<double>();
        if (!std::isfinite(*out)) return invalid_argument(fmt::format("{}: '{}' is not finite", source_, key));
        return Status::ok();
    }
    Status get_bool(const char* key, bool* out) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) return Status::ok();
        if (!it->is_boolean()) return invalid_argument(fmt::format("{}: '{}' must be true or false", source_, key));
        *out = it->get<bool>();
        return Status::ok();
    }
    Status get_string(const char* key, std::string* out) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) return Status::ok();
        if (!it->is_string()) return invalid_argument(fmt::format("{}: '{}' must be a string", source_, key));
        *out = it->get<std::string>();
        return Status::ok();
    }
    Status get_double_list(const char* key, std::vector<double>* out) const {
        auto it = j_.find(key);
        if (it == j_.end() || it->is_null()) return Status::ok();
        if (!it->is_array()) return invalid_argument(fmt::format("{}: '{}' must be a list of numbers", source_, key));
        out->clear();
        for (const auto& v : *it) {
            if (!v.is_number()) return invalid_argument(fmt::format("{}: '{}' must be a list of numbers", source_, key));
            out->push_back(v.get<double>());
        }
        return Status::ok();
    }
    const std::string& source() const { return source_; }

private:
    const json& j_;
    std::string source_;
};

// Token ids given as an int or a list of ints.
Status parse_token_ids(const json& j, const char* key, const std::string& source, std::vector<int>* out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::ok();
    out->clear();
    auto add = [&](const json& v) -> Status {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30))
            return invalid_argument(fmt::format("{}: '{}' must hold non-negative integer token ids", source, key));
        out->push_back(static_cast<int>(v.get<int64_t>()));
        return Status::ok();
    };
    if (it->is_array()) {
        for (const auto& v : *it) EXL3_RETURN_IF_ERROR(add(v));
        return Status::ok();
    }
    return add(*it);
}

// One set of RoPE parameters (rope_parameters, one layer type's entry of it, or rope_scaling) into r.
Status parse_rope_params(const json& params, const std::string& source, RopeConfig& r) {
    if (!params.is_object()) return invalid_argument(fmt::format("{} must be an object", source));
    Fields p(params, source);
    std::string type = "default";
    EXL3_RETURN_IF_ERROR(p.get_string("type", &type));
    EXL3_RETURN_IF_ERROR(p.get_string("rope_type", &type));
    static const std::pair<const char*, RopeType> kTypes[] = {
        {"default", RopeType::kDefault}, {"linear", RopeType::kLinear}, {"dynamic", RopeType::kDynamic},
        {"yarn", RopeType::kYarn},       {"llama3", RopeType::kLlama3}, {"longrope", RopeType::kLongrope},
        {"su", RopeType::kLongrope},  // the name Phi-3 configs used before "longrope"
    };
    bool known = false;
    for (const auto& [name, t] : kTypes) {
        if (type == name) {
            r.type = t;
            known = true;
        }
    }
    if (!known)
        return unsupported(fmt::format("{}: rope type '{}' is not supported (supported: default, linear, "
                                       "dynamic, yarn, llama3, longrope)",
                                       source, type));
    EXL3_RETURN_IF_ERROR(p.get_double("rope_theta", &r.theta));
    EXL3_RETURN_IF_ERROR(p.get_double("partial_rotary_factor", &r.partial_rotary_factor));
    EXL3_RETURN_IF_ERROR(p.get_double("factor", &r.factor));
    EXL3_RETURN_IF_ERROR(p.get_int("original_max_position_embeddings", &r.original_max_position_embeddings, false));
    EXL3_RETURN_IF_ERROR(p.get_double("low_freq_factor", &r.low_freq_factor));
    EXL3_RETURN_IF_ERROR(p.get_double("high_freq_factor", &r.high_freq_factor));
    EXL3_RETURN_IF_ERROR(p.get_double("beta_fast", &r.beta_fast));
    EXL3_RETURN_IF_ERROR(p.get_double("beta_slow", &r.beta_slow));
    EXL3_RETURN_IF_ERROR(p.get_double("mscale", &r.mscale));
    EXL3_RETURN_IF_ERROR(p.get_double("mscale_all_dim", &r.mscale_all_dim));
    EXL3_RETURN_IF_ERROR(p.get_bool("truncate", &r.truncate));
    EXL3_RETURN_IF_ERROR(p.get_double("attention_factor", &r.attention_factor));
    EXL3_RETURN_IF_ERROR(p.get_double_list("short_factor", &r.short_factor));
    EXL3_RETURN_IF_ERROR(p.get_double_list("long_factor", &r.long_factor));
    if (r.attention_factor != -1.0 && !(r.attention_factor > 0))
        return invalid_argument(fmt::format("{}: attention_factor must be positive", source));
    return Status::ok();
}

bool two_ropes(Arch a) { return a == Arch::kGemma3 || a == Arch::kGemma3Wrapped || a == Arch::kOlmo3; }

// Qwen3-Next and the Qwen3.5 family: Gated DeltaNet layers between gated full-attention ones.
bool hybrid_arch(Arch a) {
    return a == Arch::kQwen3Next || a == Arch::kQwen35 || a == Arch::kQwen35Moe || a == Arch::kQwen35Wrapped ||
           a == Arch::kQwen35MoeWrapped;
}
// The Qwen3.5 mixtures of experts: every layer's MLP is the experts, and the config has no intermediate_size.
bool qwen35_moe(Arch a) { return a == Arch::kQwen35Moe || a == Arch::kQwen35MoeWrapped; }

Status parse_rope(const json& cfg, const std::string& source, ModelConfig* mc) {
    RopeConfig& r = mc->rope;
    r.max_position_embeddings = mc->max_position_embeddings;
    Fields top(cfg, source);
    // The transformers-5 style keeps everything in rope_parameters; the older one has rope_theta at the top and
    // the scaling in rope_scaling ("type" or "rope_type").
    const json* params = nullptr;
    std::string where;
    if (top.has("rope_parameters")) {
        params = &cfg["rope_parameters"];
        where = "rope_parameters";
    } else if (top.has("rope_scaling")) {
        params = &cfg["rope_scaling"];
        where = "rope_scaling";
    }
    // Families whose config class gives another default theta than 10000 when the config names none.
    switch (mc->arch) {
        case Arch::kSmolLM3: r.theta = 2000000.0; break;
        case Arch::kGemma3: case Arch::kGemma3Wrapped: r.theta = 1000000.0; break;
        case Arch::kOlmo3: case Arch::kErnie45: case Arch::kCohere: r.theta = 500000.0; break;
        case Arch::kMixtral: r.theta = 1000000.0; break;
        case Arch::kGptOss: r.theta = 150000.0; break;
        default: break;
    }
    EXL3_RETURN_IF_ERROR(top.get_double("rope_theta", &r.theta));
    // A top-level partial_rotary_factor counts for Phi-3 and GLM-4 (their configs fold it into the rope parameters;
    // GLM-4's default is 0.5); Llama and the others ignore it, as transformers does (checked in the RoPE fixtures).
    // Inside rope_parameters it counts.
    const bool glm = mc->arch == Arch::kGlm4 || mc->arch == Arch::kGlm4Moe;
    if (glm) r.partial_rotary_factor = 0.5;
    if (hybrid_arch(mc->arch)) r.partial_rotary_factor = 0.25;  // Qwen3NextConfig's default, a top-level key wins
    if (mc->arch == Arch::kPhi3 || glm || hybrid_arch(mc->arch))
        EXL3_RETURN_IF_ERROR(top.get_double("partial_rotary_factor", &r.partial_rotary_factor));
    EXL3_RETURN_IF_ERROR(top.get_int("original_max_position_embeddings", &r.original_max_position_embeddings, false));
    // Gemma 3 and Olmo 3: sliding layers rotate on their own base (rope_local). Legacy configs give it as
    // rope_local_base_freq (Gemma 3) or not at all (Olmo 3's sliding layers then take the class default, 500000).
    RopeConfig& local = mc->rope_local;
    local.max_position_embeddings = mc->max_position_embeddings;
    local.theta = mc->arch == Arch::kOlmo3 ? 500000.0 : 10000.0;
    if (mc->arch != Arch::kOlmo3) EXL3_RETURN_IF_ERROR(top.get_double("rope_local_base_freq", &local.theta));
    if (params && params->is_object() && (params->contains("full_attention") || params->contains("sliding_attention"))) {
        if (!two_ropes(mc->arch))
            return unsupported(fmt::format("{}: per-layer-type '{}' is not supported for {}", source, where,
                                           mc->arch_name));
        if (params->contains("full_attention"))
            EXL3_RETURN_IF_ERROR(parse_rope_params((*params)["full_attention"], source + " " + where + ".full_attention", r));
        if (params->contains("sliding_attention"))
            EXL3_RETURN_IF_ERROR(parse_rope_params((*params)["sliding_attention"],
                                                   source + " " + where + ".sliding_attention", local));
    } else if (params) {
        EXL3_RETURN_IF_ERROR(parse_rope_params(*params, source + " " + where, r));
    } else if (mc->arch == Arch::kGptOss) {  // GptOssConfig's default: YaRN x32 over 4096 positions, not truncated
        r.type = RopeType::kYarn;
        r.factor = 32.0;
        r.beta_fast = 32.0;
        r.beta_slow = 1.0;
        r.truncate = false;
        r.original_max_position_embeddings = 4096;
    }
    if (two_ropes(mc->arch)) EXL3_RETURN_IF_ERROR(rope_validate(local, mc->head_dim).with_context(source));
    return rope_validate(r, mc->head_dim).with_context(source);
}

}  // namespace

namespace {

// The architecture: the first entry of "architectures", else model_type.
Result<const ArchInfo*> find_architecture(const json& cfg, const Fields& f, const std::string& source) {
    std::string arch_name, model_type;
    if (cfg.contains("architectures")) {
        const json& a = cfg["architectures"];
        if (!a.is_array() || a.empty() || !a[0].is_string())
            return invalid_argument(source + ": 'architectures' must be a non-empty list of strings");
        arch_name = a[0].get<std::string>();
    }
    EXL3_RETURN_IF_ERROR(f.get_string("model_type", &model_type));
    for (const auto& ai : supported_architectures())
        if ((!arch_name.empty() && arch_name == ai.hf_class) || (arch_name.empty() && model_type == ai.model_type))
            return &ai;
    std::string names;
    for (const auto& ai : supported_architectures()) names += (names.empty() ? "" : ", ") + std::string(ai.hf_class);
    return unsupported(fmt::format("{}: architecture '{}' is not supported (supported: {})", source,
                                   arch_name.empty() ? model_type : arch_name, names));
}

// Shapes, norm epsilon, context and activation of the decoder (the text model's own config object).
Status parse_shapes(const Fields& f, const std::string& source, ModelConfig& mc) {
    EXL3_RETURN_IF_ERROR(f.get_int("vocab_size", &mc.vocab_size, true));
    EXL3_RETURN_IF_ERROR(f.get_int("hidden_size", &mc.hidden_size, true));
    EXL3_RETURN_IF_ERROR(f.get_int("intermediate_size", &mc.intermediate_size, !qwen35_moe(mc.arch)));
    EXL3_RETURN_IF_ERROR(f.get_int("num_hidden_layers", &mc.num_layers, true, 1, 100000));
    EXL3_RETURN_IF_ERROR(f.get_int("num_attention_heads", &mc.num_heads, true, 1, 100000));
    mc.num_kv_heads = mc.num_heads;
    EXL3_RETURN_IF_ERROR(f.get_int("num_key_value_heads", &mc.num_kv_heads, false, 1, 100000));
    if (mc.num_heads % mc.num_kv_heads)
        return invalid_argument(fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                            source, mc.num_heads, mc.num_kv_heads));
    const bool gemma = mc.arch == Arch::kGemma2 || mc.arch == Arch::kGemma3 || mc.arch == Arch::kGemma3Wrapped;
    if (f.has("head_dim") && mc.arch != Arch::kCohere2) {  // Cohere 2's config forces hidden / heads
        EXL3_RETURN_IF_ERROR(f.get_int("head_dim", &mc.head_dim, true, 1, 4096));
    } else if (gemma || mc.arch == Arch::kErnie45 || mc.arch == Arch::kGptOss || hybrid_arch(mc.arch)) {
        // the config classes' defaults
        mc.head_dim = mc.arch == Arch::kErnie45 ? 128 : mc.arch == Arch::kGptOss ? 64 : 256;
    } else {
        if (mc.hidden_size % mc.num_heads)
            return invalid_argument(fmt::format("{}: hidden_size {} is not a multiple of num_attention_heads {} and "
                                                "no head_dim is given",
                                                source, mc.hidden_size, mc.num_heads));
        mc.head_dim = mc.hidden_size / mc.num_heads;
    }
    if (mc.head_dim % 2) return invalid_argument(fmt::format("{}: head_dim {} must be even", source, mc.head_dim));
    const bool cohere = mc.arch == Arch::kCohere || mc.arch == Arch::kCohere2;
    if (cohere || mc.arch == Arch::kGptOss) mc.rms_norm_eps = 1e-5;
    EXL3_RETURN_IF_ERROR(f.get_double(cohere ? "layer_norm_eps" : "rms_norm_eps", &mc.rms_norm_eps));
    if (!(mc.rms_norm_eps > 0)) return invalid_argument(source + ": the norm epsilon must be positive");
    mc.max_position_embeddings = hybrid_arch(mc.arch) ? 32768 : 2048;
    EXL3_RETURN_IF_ERROR(f.get_int("max_position_embeddings", &mc.max_position_embeddings, false));
    // The config classes that tie by default (the others do not).
    mc.tie_word_embeddings = gemma || cohere || mc.arch == Arch::kErnie45 || mc.arch == Arch::kSmolLM3;
    EXL3_RETURN_IF_ERROR(f.get_bool("tie_word_embeddings", &mc.tie_word_embeddings));
    // Gemma's configs name it hidden_activation (their hidden_act is a legacy key that loses).
    std::string act = gemma ? "gelu_pytorch_tanh" : "silu";
    EXL3_RETURN_IF_ERROR(f.get_string("hidden_act", &act));
    EXL3_RETURN_IF_ERROR(f.get_string("hidden_activation", &act));
    if (act == "silu" || act == "swish") {
        mc.act = Act::kSilu;
    } else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") {
        mc.act = Act::kGeluTanh;
    } else {
        return unsupported(
            fmt::format("{}: activation '{}' is not supported (silu, gelu_pytorch_tanh)", source, act));
    }
    return Status::ok();
}

// Biases and q/k norms, by family.
Status parse_biases(const Fields& f, ModelConfig& mc) {
    bool attention_bias = false, out_bias = false;
    EXL3_RETURN_IF_ERROR(f.get_bool("attention_bias", &attention_bias));
    EXL3_RETURN_IF_ERROR(f.get_bool("mlp_bias", &mc.mlp_bias));
    switch (mc.arch) {
        case Arch::kLlama:
        case Arch::kQwen3:
        case Arch::kSmolLM3:
        case Arch::kGranite:
            mc.qkv_bias = mc.o_bias = attention_bias;
            break;
        case Arch::kQwen2:
            mc.qkv_bias = true;  // fixed by the architecture
            break;
        case Arch::kQwen2Moe:  // fixed too, but transformers 5 writes it out
            mc.qkv_bias = true;
            EXL3_RETURN_IF_ERROR(f.get_bool("qkv_bias", &mc.qkv_bias));
            break;
        case Arch::kQwen3Moe:
        case Arch::kQwen3Next:
        case Arch::kQwen35:
        case Arch::kQwen35Moe:
        case Arch::kQwen35Wrapped:
        case Arch::kQwen35MoeWrapped:
            mc.qkv_bias = mc.o_bias = attention_bias;
            break;
        case Arch::kGlm4Moe:  // q, k, v only
            mc.qkv_bias = attention_bias;
            break;
        case Arch::kMixtral:
            break;
        case Arch::kGptOss:  // GptOssConfig sets attention_bias whatever the file says
            mc.qkv_bias = mc.o_bias = true;
            break;
        case Arch::kSeedOss:  // q, k, v biased by attention_bias; o by attention_out_bias
            EXL3_RETURN_IF_ERROR(f.get_bool("attention_out_bias", &out_bias));
            mc.qkv_bias = attention_bias;
            mc.o_bias = out_bias;
            break;
        case Arch::kGemma2:
        case Arch::kGemma3:
        case Arch::kGemma3Wrapped:
        case Arch::kOlmo2:
        case Arch::kOlmo3:
        case Arch::kCohere:
        case Arch::kCohere2:
            mc.qkv_bias = mc.o_bias = attention_bias;
            break;
        case Arch::kGlm4:  // q, k, v biased unless attention_bias says otherwise; o never
            attention_bias = true;
            EXL3_RETURN_IF_ERROR(f.get_bool("attention_bias", &attention_bias));
            mc.qkv_bias = attention_bias;
            break;
        case Arch::kErnie45: {  // one flag for every linear
            bool use_bias = false;
            EXL3_RETURN_IF_ERROR(f.get_bool("use_bias", &use_bias));
            mc.qkv_bias = mc.o_bias = mc.mlp_bias = use_bias;
            break;
        }
        case Arch::kMistral:
        case Arch::kMistral3:
        case Arch::kPhi3:
        case Arch::kExaone4:
            break;
    }
    if (mc.arch != Arch::kLlama && mc.arch != Arch::kSeedOss && mc.arch != Arch::kGranite && mc.arch != Arch::kErnie45)
        mc.mlp_bias = false;
    if (hybrid_arch(mc.arch)) mc.qk_norm = QkNorm::kHead;
    switch (mc.arch) {
        case Arch::kQwen3: case Arch::kQwen3Moe: case Arch::kGemma3: case Arch::kGemma3Wrapped: case Arch::kExaone4:
            mc.qk_norm = QkNorm::kHead;
            break;
        case Arch::kGlm4Moe: {
            bool qk = false;
            EXL3_RETURN_IF_ERROR(f.get_bool("use_qk_norm", &qk));
            if (qk) mc.qk_norm = QkNorm::kHead;
            break;
        }
        case Arch::kOlmo2: case Arch::kOlmo3:
            mc.qk_norm = QkNorm::kFlat;
            break;
        default:
            break;
    }
    if (mc.arch == Arch::kCohere) {
        bool qk = false;
        EXL3_RETURN_IF_ERROR(f.get_bool("use_qk_norm", &qk));
        if (qk) mc.qk_norm = QkNorm::kHeads;  // Command R+: a LayerNorm of each head's own
    }
    return Status::ok();
}

// Sliding windows: layer_types when given; else Mistral and Phi-3 apply sliding_window to every layer, Qwen2/3 from
// max_window_layers on when use_sliding_window, SmolLM3 (with use_sliding_window) on its layers without RoPE.
Status parse_windows(const json& cfg, const Fields& f, const std::string& source, ModelConfig& mc) {
    int window = 0;
    const bool periodic = mc.arch == Arch::kGemma2 || mc.arch == Arch::kGemma3 || mc.arch == Arch::kGemma3Wrapped ||
                          mc.arch == Arch::kOlmo3 || mc.arch == Arch::kCohere2 || mc.arch == Arch::kExaone4 ||
                          mc.arch == Arch::kGptOss;
    // Those families' config classes window 4096 positions unless told otherwise (EXAONE 4's null: no windows);
    // gpt-oss's 128.
    if (periodic && !cfg.contains("sliding_window")) window = mc.arch == Arch::kGptOss ? 128 : 4096;
    EXL3_RETURN_IF_ERROR(f.get_int("sliding_window", &window, false, 0));  // 0 (Qwen2-MoE): none
    mc.sliding_window.assign(static_cast<size_t>(mc.num_layers), 0);
    if (hybrid_arch(mc.arch)) {  // no windows; layer_types says which layers are linear (parse_hybrid)
        bool use = false;
        EXL3_RETURN_IF_ERROR(f.get_bool("use_sliding_window", &use));
        if (use) return unsupported(source + ": use_sliding_window is not supported for " + mc.arch_name);
        return Status::ok();
    }
    if (cfg.contains("layer_types") && !cfg["layer_types"].is_null()) {
        const json& lt = cfg["layer_types"];
        if (!lt.is_array() || lt.size() != static_cast<size_t>(mc.num_layers))
            return invalid_argument(fmt::format("{}: layer_types must list {} layers", source, mc.num_layers));
        for (size_t i = 0; i < lt.size(); ++i) {
            std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
            if (t == "sliding_attention") {
                if (window <= 0)
                    return invalid_argument(source + ": layer_types has sliding_attention but no sliding_window");
                mc.sliding_window[i] = window;
            } else if (t != "full_attention") {
                return unsupported(fmt::format("{}: layer type '{}' is not supported", source, t));
            }
        }
        return Status::ok();
    }
    if (periodic) {
        // Without layer_types: every pattern-th layer global, the others windowed (Gemma 2, gpt-oss: every other one).
        int pattern = mc.arch == Arch::kGemma2 || mc.arch == Arch::kGptOss                    ? 2
                      : mc.arch == Arch::kGemma3 || mc.arch == Arch::kGemma3Wrapped ? 6
                                                                                      : 4;
        const char* key = f.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
        if (cfg.contains(key) && cfg[key].is_string()) {  // EXAONE 4's "LLLG": L windowed, G global, repeating
            const std::string pat = cfg[key].get<std::string>();
            if (pat.empty() || pat.find_first_not_of("LG") != std::string::npos)
                return invalid_argument(fmt::format("{}: {} '{}' must be a string of L and G", source, key, pat));
            for (int i = 0; i < mc.num_layers; ++i)
                if (pat[static_cast<size_t>(i) % pat.size()] == 'L') mc.sliding_window[static_cast<size_t>(i)] = window;
            return Status::ok();
        }
        EXL3_RETURN_IF_ERROR(f.get_int(key, &pattern, false, 1));
        if (window > 0)
            for (int i = 0; i < mc.num_layers; ++i)
                if ((i + 1) % pattern != 0) mc.sliding_window[static_cast<size_t>(i)] = window;
        return Status::ok();
    }
    bool use = false;
    EXL3_RETURN_IF_ERROR(f.get_bool("use_sliding_window", &use));
    if (mc.arch == Arch::kMistral || mc.arch == Arch::kMistral3 || mc.arch == Arch::kPhi3 || mc.arch == Arch::kMixtral) {
        for (auto& w : mc.sliding_window) w = window;
    } else if (mc.arch == Arch::kQwen2 || mc.arch == Arch::kQwen3 || mc.arch == Arch::kQwen2Moe ||
               mc.arch == Arch::kQwen3Moe) {
        int from = mc.num_layers;
        EXL3_RETURN_IF_ERROR(f.get_int("max_window_layers", &from, false, 0));
        if (use && window > 0)
            for (int i = from; i < mc.num_layers; ++i) mc.sliding_window[static_cast<size_t>(i)] = window;
    } else if (mc.arch == Arch::kSmolLM3 && use && window > 0) {
        for (int i = 0; i < mc.num_layers; ++i)
            if (!mc.rope_layer[static_cast<size_t>(i)]) mc.sliding_window[static_cast<size_t>(i)] = window;
    }
    return Status::ok();
}

// Which layers rotate q and k: all, but SmolLM3's no_rope_layers (1: RoPE, 0: none; by default every
// no_rope_layer_interval-th layer has none).
Status parse_rope_layers(const json& cfg, const Fields& f, const std::string& source, ModelConfig& mc) {
    mc.rope_layer.assign(static_cast<size_t>(mc.num_layers), 1);
    if (mc.arch != Arch::kSmolLM3) return Status::ok();
    if (cfg.contains("no_rope_layers") && !cfg["no_rope_layers"].is_null()) {
        const json& l = cfg["no_rope_layers"];
        if (!l.is_array() || l.size() != static_cast<size_t>(mc.num_layers))
            return invalid_argument(fmt::format("{}: no_rope_layers must list {} layers", source, mc.num_layers));
        for (size_t i = 0; i < l.size(); ++i) {
            if (!l[i].is_number_integer() || (l[i].get<int64_t>() != 0 && l[i].get<int64_t>() != 1))
                return invalid_argument(fmt::format("{}: no_rope_layers holds 0 or 1 per layer", source));
            mc.rope_layer[i] = static_cast<uint8_t>(l[i].get<int64_t>());
        }
        return Status::ok();
    }
    int interval = 4;
    EXL3_RETURN_IF_ERROR(f.get_int("no_rope_layer_interval", &interval, false, 1));
    for (int i = 0; i < mc.num_layers; ++i) mc.rope_layer[static_cast<size_t>(i)] = (i + 1) % interval != 0;
    return Status::ok();
}

// Which layers rotate on which RoPE, where that follows the windows: Gemma 3 and Olmo 3 give sliding layers their
// own base; Cohere 2 and (with windows at all) EXAONE 4 rotate only on sliding layers.
void rope_by_window(const json& cfg, ModelConfig& mc) {
    const bool exaone_nope = mc.arch == Arch::kExaone4 && !(cfg.contains("sliding_window") && cfg["sliding_window"].is_null());
    for (int i = 0; i < mc.num_layers; ++i) {
        const bool sliding = mc.sliding_window[static_cast<size_t>(i)] > 0;
        uint8_t& r = mc.rope_layer[static_cast<size_t>(i)];
        if (two_ropes(mc.arch)) r = sliding ? 2 : 1;
        if (mc.arch == Arch::kCohere2 || exaone_nope) r = sliding ? 1 : 0;
    }
}

// The layer's shape and the families' own operations: where the norms sit and what they compute, the activation's
// extras, RoPE layout, Gemma's scale and caps, Cohere's logit scale.
Status parse_family(const Fields& f, const std::string& source, ModelConfig& mc) {
    switch (mc.arch) {
        case Arch::kGemma2:
        case Arch::kGemma3:
        case Arch::kGemma3Wrapped: {
            mc.norm_offset = true;
            mc.post_norms = true;
            mc.embed_scale = std::sqrt(static_cast<float>(mc.hidden_size));
            double qpas = 256;
            EXL3_RETURN_IF_ERROR(f.get_double("query_pre_attn_scalar", &qpas));
            if (!(qpas > 0)) return invalid_argument(source + ": query_pre_attn_scalar must be positive");
            mc.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
            // Gemma 2's caps default to 50 and 30; a key given as null switches its cap off.
            double attn_cap = mc.arch == Arch::kGemma2 && !f.present("attn_logit_softcapping") ? 50.0 : 0.0;
            double final_cap = mc.arch == Arch::kGemma2 && !f.present("final_logit_softcapping") ? 30.0 : 0.0;
            EXL3_RETURN_IF_ERROR(f.get_double("attn_logit_softcapping", &attn_cap));
            EXL3_RETURN_IF_ERROR(f.get_double("final_logit_softcapping", &final_cap));
            if (attn_cap < 0 || final_cap < 0) return invalid_argument(source + ": soft-capping values must be >= 0");
            mc.attn_softcap = static_cast<float>(attn_cap);
            mc.logit_softcap = static_cast<float>(final_cap);
            bool bidirectional = false;
            EXL3_RETURN_IF_ERROR(f.get_bool("use_bidirectional_attention", &bidirectional));
            if (bidirectional) return unsupported(source + ": use_bidirectional_attention (an encoder) is not supported");
            break;
        }
        case Arch::kGlm4:
            mc.post_norms = true;
            mc.rope_interleaved = true;
            break;
        case Arch::kOlmo2:
        case Arch::kOlmo3:
        case Arch::kExaone4:
            mc.pre_norms = false;
            mc.post_norms = true;
            break;
        case Arch::kErnie45:
            mc.rope_interleaved = true;
            break;
        case Arch::kGptOss:
            mc.attn_sinks = true;
            break;
        case Arch::kCohere:
        case Arch::kCohere2: {
            mc.norm = NormKind::kLayerNorm;
            mc.parallel = true;
            mc.rope_interleaved = true;
            double scale = 0.0625;
            EXL3_RETURN_IF_ERROR(f.get_double("logit_scale", &scale));
            mc.logit_scale = static_cast<float>(scale);
            break;
        }
        default:
            break;
    }
    return Status::ok();
}

// gpt-oss: every MLP is the experts, as wide as intermediate_size. The router takes the top k of its logits x R^T + b
// and a softmax over those k: the weights of the softmax over all of them renormalised over the top k (norm_topk).
// Biased experts with the clamped SwiGLU (alpha 1.702 in transformers' code, the limit swiglu_limit, 7 by default).
// Defaults are GptOssConfig's; the Hub's files also say experts_per_token, which transformers does not read.
Status parse_gpt_oss_moe(const Fields& f, const std::string& source, ModelConfig& mc) {
    mc.num_experts = 128;
    mc.experts_per_token = 4;
    EXL3_RETURN_IF_ERROR(f.get_int("num_local_experts", &mc.num_experts, false, 1, 4096));
    EXL3_RETURN_IF_ERROR(f.get_int("num_experts_per_tok", &mc.experts_per_token, false, 1, 4096));
    if (mc.experts_per_token > mc.num_experts)
        return invalid_argument(fmt::format("{}: num_experts_per_tok {} exceeds the {} experts", source,
                                            mc.experts_per_token, mc.num_experts));
    mc.expert_size = mc.intermediate_size;
    mc.moe_layer.assign(static_cast<size_t>(mc.num_layers), 1);
    mc.norm_topk = true;
    mc.router_bias = mc.expert_bias = true;
    mc.act = Act::kSwigluClamp;
    double limit = 7.0;
    EXL3_RETURN_IF_ERROR(f.get_double("swiglu_limit", &limit));
    if (!(limit > 0)) return invalid_argument(fmt::format("{}: swiglu_limit {} must be positive", source, limit));
    mc.glu_limit = static_cast<float>(limit);
    return Status::ok();
}

// Which layers are mixtures of experts and how they route: Qwen2/3-MoE and Qwen3-Next (every decoder_sparse_step-th
// layer but mlp_only_layers), Mixtral and Qwen3.5-MoE (all), GLM-4.5 (all after first_k_dense_replace), gpt-oss (all).
Status parse_moe(const json& cfg, const Fields& f, const std::string& source, ModelConfig& mc) {
    if (mc.arch == Arch::kGptOss) return parse_gpt_oss_moe(f, source, mc);
    const bool next = mc.arch == Arch::kQwen3Next, q35 = qwen35_moe(mc.arch);
    const bool qwen = mc.arch == Arch::kQwen2Moe || mc.arch == Arch::kQwen3Moe || next;
    if (!qwen && !q35 && mc.arch != Arch::kMixtral && mc.arch != Arch::kGlm4Moe) return Status::ok();
    // The Hub's configs name the count by family; transformers 5 writes num_local_experts for all of them.
    const char* count = mc.arch == Arch::kMixtral ? "num_local_experts" : mc.arch == Arch::kGlm4Moe ? "n_routed_experts" : "num_experts";
    if (!f.has(count) && f.has("num_local_experts")) count = "num_local_experts";
    // Qwen3-Next's and Qwen3.5-MoE's config classes give defaults (Qwen3-Next with 0 experts is dense).
    const bool defaults = next || q35;
    if (defaults) {
        mc.num_experts = next ? 512 : 256;
        mc.experts_per_token = next ? 10 : 8;
        mc.expert_size = mc.shared_expert_size = 512;
        mc.norm_topk = true;  // Qwen3-Next's default; Qwen3.5-MoE always renormalises
    }
    EXL3_RETURN_IF_ERROR(f.get_int(count, &mc.num_experts, !defaults, next ? 0 : 1, 4096));
    if (mc.num_experts == 0) return Status::ok();
    EXL3_RETURN_IF_ERROR(f.get_int("num_experts_per_tok", &mc.experts_per_token, !defaults, 1, 4096));
    if (mc.experts_per_token > mc.num_experts)
        return invalid_argument(fmt::format("{}: num_experts_per_tok {} exceeds the {} experts", source,
                                            mc.experts_per_token, mc.num_experts));
    if (mc.arch == Arch::kMixtral) {
        mc.expert_size = mc.intermediate_size;
    } else {
        EXL3_RETURN_IF_ERROR(f.get_int("moe_intermediate_size", &mc.expert_size, !defaults));
    }
    if (defaults) {  // a shared expert behind a sigmoid gate
        EXL3_RETURN_IF_ERROR(f.get_int("shared_expert_intermediate_size", &mc.shared_expert_size, false, 1));
        mc.shared_expert_gate = true;
    }
    mc.moe_layer.assign(static_cast<size_t>(mc.num_layers), 1);
    if (qwen) {
        int step = 1;
        EXL3_RETURN_IF_ERROR(f.get_int("decoder_sparse_step", &step, false, 1));
        for (int i = 0; i < mc.num_layers; ++i) mc.moe_layer[static_cast<size_t>(i)] = (i + 1) % step == 0;
        if (cfg.contains("mlp_only_layers") && !cfg["mlp_only_layers"].is_null()) {
            const json& l = cfg["mlp_only_layers"];
            if (!l.is_array()) return invalid_argument(source + ": mlp_only_layers must be a list of layer indices");
            for (const json& v : l) {
                if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= mc.num_layers)
                    return invalid_argument(fmt::format("{}: mlp_only_layers holds layer indices below {}", source, mc.num_layers));
                mc.moe_layer[static_cast<size_t>(v.get<int64_t>())] = 0;
            }
        }
        EXL3_RETURN_IF_ERROR(f.get_bool("norm_topk_prob", &mc.norm_topk));
        if (mc.arch == Arch::kQwen2Moe) {
            EXL3_RETURN_IF_ERROR(f.get_int("shared_expert_intermediate_size", &mc.shared_expert_size, false, 0));
            mc.shared_expert_gate = mc.shared_expert_size > 0;
        }
    } else if (mc.arch == Arch::kMixtral || q35) {
        mc.norm_topk = true;  // every layer, the chosen weights renormalised
    } else {  // GLM-4.5
        int dense = 1, shared = 1;
        EXL3_RETURN_IF_ERROR(f.get_int("first_k_dense_replace", &dense, false, 0));
        for (int i = 0; i < std::min(dense, mc.num_layers); ++i) mc.moe_layer[static_cast<size_t>(i)] = 0;
        EXL3_RETURN_IF_ERROR(f.get_int("n_shared_experts", &shared, false, 0, 4096));
        mc.shared_expert_size = shared * mc.expert_size;
        mc.router_sigmoid = true;
        mc.norm_topk = true;
        EXL3_RETURN_IF_ERROR(f.get_bool("norm_topk_prob", &mc.norm_topk));
        EXL3_RETURN_IF_ERROR(f.get_int("n_group", &mc.expert_groups, false, 1, 4096));
        EXL3_RETURN_IF_ERROR(f.get_int("topk_group", &mc.topk_groups, false, 1, 4096));
        double scale = 1.0;
        EXL3_RETURN_IF_ERROR(f.get_double("routed_scaling_factor", &scale));
        mc.routed_scale = static_cast<float>(scale);
        if (mc.num_experts % mc.expert_groups || mc.topk_groups > mc.expert_groups ||
            mc.experts_per_token > mc.topk_groups * (mc.num_experts / mc.expert_groups) || mc.num_experts / mc.expert_groups < 2)
            return invalid_argument(fmt::format("{}: {} experts in n_group {} groups with topk_group {} cannot route "
                                                "num_experts_per_tok {}",
                                                source, mc.num_experts, mc.expert_groups, mc.topk_groups,
                                                mc.experts_per_token));
    }
    return Status::ok();
}

// The hybrids' token mixers: which layers are Gated DeltaNet (layer_types, else every full_attention_interval-th
// layer is full attention), the linear layers' shapes (the config classes' defaults), and the gated full attention.
Status parse_hybrid(const json& cfg, const Fields& f, const std::string& source, ModelConfig& mc) {
    if (!hybrid_arch(mc.arch)) return Status::ok();
    mc.attn_gate = true;
    mc.norm_offset = true;  // every RMSNorm but the gated one stores w for (1 + w)
    mc.lin_grouped = mc.arch == Arch::kQwen3Next;
    mc.lin_k_heads = 16;
    mc.lin_v_heads = 32;
    mc.lin_k_dim = mc.lin_v_dim = 128;
    mc.lin_conv_kernel = 4;
    EXL3_RETURN_IF_ERROR(f.get_int("linear_num_key_heads", &mc.lin_k_heads, false, 1, 4096));
    EXL3_RETURN_IF_ERROR(f.get_int("linear_num_value_heads", &mc.lin_v_heads, false, 1, 4096));
    EXL3_RETURN_IF_ERROR(f.get_int("linear_key_head_dim", &mc.lin_k_dim, false, 1, 4096));
    EXL3_RETURN_IF_ERROR(f.get_int("linear_value_head_dim", &mc.lin_v_dim, false, 1, 4096));
    EXL3_RETURN_IF_ERROR(f.get_int("linear_conv_kernel_dim", &mc.lin_conv_kernel, false, 1, 64));
    if (mc.lin_v_heads % mc.lin_k_heads)
        return invalid_argument(fmt::format("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                                            source, mc.lin_v_heads, mc.lin_k_heads));
    if (mc.act != Act::kSilu)
        return unsupported(source + ": a hybrid model's hidden_act must be silu (its conv and gated norm use SiLU)");
    mc.linear_layer.assign(static_cast<size_t>(mc.num_layers), 0);
    if (cfg.contains("layer_types") && !cfg["layer_types"].is_null()) {
        const json& lt = cfg["layer_types"];
        if (!lt.is_array() || lt.size() != static_cast<size_t>(mc.num_layers))
            return invalid_argument(fmt::format("{}: layer_types must list {} layers", source, mc.num_layers));
        for (size_t i = 0; i < lt.size(); ++i) {
            const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : lt[i].dump();
            if (t == "linear_attention" || t == "mamba") {  // "mamba", "attention": the legacy names
                mc.linear_layer[i] = 1;
            } else if (t != "full_attention" && t != "attention") {
                return unsupported(fmt::format("{}: layer_types[{}] = '{}' is not a layer type of {} "
                                               "(linear_attention, full_attention)",
                                               source, i, t, mc.arch_name));
            }
        }
        return Status::ok();
    }
    int interval = 4;
    EXL3_RETURN_IF_ERROR(f.get_int("full_attention_interval", &interval, false, 1));
    for (int i = 0; i < mc.num_layers; ++i) mc.linear_layer[static_cast<size_t>(i)] = (i + 1) % interval != 0;
    return Status::ok();
}

// Granite's four scalars: embedding, residual-branch and attention multipliers, and the logit divisor.
Status parse_multipliers(const Fields& f, const std::string& source, ModelConfig& mc) {
    if (mc.arch != Arch::kGranite) return Status::ok();
    double embed = 1.0, residual = 1.0, attention = 1.0, logits = 1.0;  // GraniteConfig's defaults
    EXL3_RETURN_IF_ERROR(f.get_double("embedding_multiplier", &embed));
    EXL3_RETURN_IF_ERROR(f.get_double("residual_multiplier", &residual));
    EXL3_RETURN_IF_ERROR(f.get_double("attention_multiplier", &attention));
    EXL3_RETURN_IF_ERROR(f.get_double("logits_scaling", &logits));
    if (!(logits != 0.0)) return invalid_argument(source + ": logits_scaling must not be 0");
    mc.embed_scale = static_cast<float>(embed);
    mc.residual_scale = static_cast<float>(residual);
    mc.attn_scale = static_cast<float>(attention);
    mc.logit_scale = static_cast<float>(1.0 / logits);
    return Status::ok();
}

// A quantization_config of quant_method mxfp4 (gpt-oss as published): its experts are MXFP4 blocks, dequantized at
// load. Other methods are left to the weight loader (EXL3, or a clear refusal naming the method).
Status parse_mxfp4(const json& cfg, const std::string& source, ModelConfig& mc) {
    auto it = cfg.find("quantization_config");
    if (it == cfg.end() || !it->is_object()) return Status::ok();
    auto m = it->find("quant_method");
    if (m == it->end() || !m->is_string() || m->get<std::string>() != "mxfp4") return Status::ok();
    if (mc.arch != Arch::kGptOss)
        return unsupported(fmt::format("{}: quant_method 'mxfp4' is read for gpt-oss's experts only, not for {}",
                                       source, mc.arch_name));
    mc.mxfp4_experts = true;
    return Status::ok();
}

// The object that describes the decoder: the config itself, or a multimodal wrapper's text_config.
Result<const json*> text_config(const json& cfg, const ArchInfo& info, const std::string& source) {
    const Arch a = info.arch;
    if (a != Arch::kMistral3 && a != Arch::kGemma3Wrapped && a != Arch::kQwen35Wrapped && a != Arch::kQwen35MoeWrapped)
        return &cfg;
    if (!cfg.contains("text_config") || !cfg["text_config"].is_object())
        return invalid_argument(fmt::format("{}: a {} config needs a text_config object", source, info.hf_class));
    const json& t = cfg["text_config"];
    const char* want = a == Arch::kMistral3        ? "mistral"
                       : a == Arch::kGemma3Wrapped ? "gemma3_text"
                       : a == Arch::kQwen35Wrapped ? "qwen3_5_text"
                                                   : "qwen3_5_moe_text";
    const std::string mt = t.contains("model_type") && t["model_type"].is_string() ? t["model_type"].get<std::string>()
                                                                                    : want;
    if (mt != want)
        return unsupported(fmt::format("{}: text_config of model_type '{}' is not supported in a {} (only '{}')",
                                       source, mt, info.hf_class, want));
    return &t;
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& text, const std::string& source) {
    json cfg = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_discarded()) return invalid_argument(source + ": not valid JSON");
    if (!cfg.is_object()) return invalid_argument(source + ": not a JSON object");
    Fields top(cfg, source);
    ModelConfig mc;
    EXL3_ASSIGN_OR_RETURN(const ArchInfo* info, find_architecture(cfg, top, source));
    mc.arch = info->arch;
    mc.arch_name = info->hf_class;
    EXL3_ASSIGN_OR_RETURN(const json* tc, text_config(cfg, *info, source));
    const std::string tsource = tc == &cfg ? source : source + " text_config";
    Fields f(*tc, tsource);
    EXL3_RETURN_IF_ERROR(parse_shapes(f, tsource, mc));
    // A wrapper's tie_word_embeddings is its own (transformers ties by the top-level key, true by default there).
    // Qwen3.5's (Qwen3-VL's config class) unties by default; the text config's key counts where the wrapper has none.
    if (tc != &cfg) {
        const bool qwen = hybrid_arch(mc.arch);
        mc.tie_word_embeddings = !qwen;
        if (qwen) EXL3_RETURN_IF_ERROR(f.get_bool("tie_word_embeddings", &mc.tie_word_embeddings));
        EXL3_RETURN_IF_ERROR(top.get_bool("tie_word_embeddings", &mc.tie_word_embeddings));
    }
    EXL3_RETURN_IF_ERROR(parse_biases(f, mc));
    EXL3_RETURN_IF_ERROR(parse_rope_layers(*tc, f, tsource, mc));
    EXL3_RETURN_IF_ERROR(parse_windows(*tc, f, tsource, mc));
    rope_by_window(*tc, mc);
    EXL3_RETURN_IF_ERROR(parse_family(f, tsource, mc));
    EXL3_RETURN_IF_ERROR(parse_multipliers(f, tsource, mc));
    EXL3_RETURN_IF_ERROR(parse_moe(*tc, f, tsource, mc));
    EXL3_RETURN_IF_ERROR(parse_hybrid(*tc, f, tsource, mc));

    std::string dtype = "bfloat16";
    for (const Fields* g : {&f, &top}) {  // the wrapper's dtype wins where both say
        EXL3_RETURN_IF_ERROR(g->get_string("torch_dtype", &dtype));
        EXL3_RETURN_IF_ERROR(g->get_string("dtype", &dtype));
    }
    if (dtype == "bfloat16") mc.dtype = DType::kBF16;
    else if (dtype == "float16") mc.dtype = DType::kF16;
    else if (dtype == "float32") mc.dtype = DType::kF32;
    else return unsupported(fmt::format("{}: dtype '{}' is not supported (bfloat16, float16, float32)", source, dtype));
    EXL3_RETURN_IF_ERROR(parse_mxfp4(cfg, source, mc));

    std::vector<int> bos;
    EXL3_RETURN_IF_ERROR(parse_token_ids(*tc, "bos_token_id", tsource, &bos));
    if (!bos.empty()) mc.bos_token_id = bos[0];
    EXL3_RETURN_IF_ERROR(parse_token_ids(*tc, "eos_token_id", tsource, &mc.eos_token_ids));
    if (tc != &cfg && mc.eos_token_ids.empty())
        EXL3_RETURN_IF_ERROR(parse_token_ids(cfg, "eos_token_id", source, &mc.eos_token_ids));

    EXL3_RETURN_IF_ERROR(parse_rope(*tc, tsource, &mc));
    return mc;
}

std::string family_features(const ModelConfig& c) {
    std::vector<std::string> f;
    if (c.norm == NormKind::kLayerNorm) f.push_back("LayerNorm");
    if (c.norm_offset) f.push_back("norms (1 + w)");
    if (!c.pre_norms) f.push_back("no pre-norms");
    if (c.post_norms) f.push_back("post-norms");
    if (c.parallel) f.push_back("parallel attention + MLP");
    if (c.qk_norm == QkNorm::kFlat) f.push_back("q/k norm over all heads");
    if (c.qk_norm == QkNorm::kHeads) f.push_back("q/k norm of each head's own");
    if (c.rope_interleaved) f.push_back("GPT-J RoPE");
    if (c.rope.partial_rotary_factor < 1.0) f.push_back(fmt::format("partial RoPE {:g}", c.rope.partial_rotary_factor));
    if (uses_local_rope(c)) f.push_back(fmt::format("local RoPE theta {:g}", c.rope_local.theta));
    int nope = 0, windowed = 0;
    for (int i = 0; i < c.num_layers; ++i) {
        nope += !c.rope_layer[static_cast<size_t>(i)];
        windowed += c.sliding_window[static_cast<size_t>(i)] > 0;
    }
    if (nope) f.push_back(fmt::format("{} layers without RoPE", nope));
    if (windowed && windowed < c.num_layers) f.push_back(fmt::format("{} of {} layers windowed", windowed, c.num_layers));
    if (c.act == Act::kGeluTanh) f.push_back("GeGLU (tanh)");
    if (c.act == Act::kSwigluClamp) f.push_back(fmt::format("clamped SwiGLU (limit {:g})", c.glu_limit));
    if (c.attn_sinks) f.push_back("attention sinks");
    if (c.embed_scale != 1.0f) f.push_back(fmt::format("embeddings x {:g}", c.embed_scale));
    if (c.residual_scale != 1.0f) f.push_back(fmt::format("residual x {:g}", c.residual_scale));
    if (c.attn_scale > 0.0f) f.push_back(fmt::format("attention scale {:g}", c.attn_scale));
    if (c.attn_softcap > 0.0f) f.push_back(fmt::format("attention soft-cap {:g}", c.attn_softcap));
    if (c.logit_scale != 1.0f) f.push_back(fmt::format("logits x {:g}", c.logit_scale));
    if (c.logit_softcap > 0.0f) f.push_back(fmt::format("logit soft-cap {:g}", c.logit_softcap));
    if (c.num_experts > 0) {
        int moe = 0;
        for (int i = 0; i < c.num_layers; ++i) moe += c.is_moe(i);
        f.push_back(fmt::format("{} experts ({} a token{}{}{}{}) in {} of {} layers", c.num_experts,
                                c.experts_per_token, c.router_sigmoid ? ", sigmoid router" : "",
                                c.shared_expert_size ? ", shared expert" : "",
                                c.norm_topk ? "" : ", weights not renormalised", c.expert_bias ? ", biased" : "", moe,
                                c.num_layers));
        if (c.mxfp4_experts) f.push_back("MXFP4 experts (dequantized at load)");
    }
    if (c.hybrid())
        f.push_back(fmt::format("{} of {} layers Gated DeltaNet ({} key / {} value heads of {} / {}, conv {}){}",
                                c.num_linear_layers(), c.num_layers, c.lin_k_heads, c.lin_v_heads, c.lin_k_dim,
                                c.lin_v_dim, c.lin_conv_kernel, c.attn_gate ? ", gated attention" : ""));
    std::string s;
    for (const auto& x : f) s += (s.empty() ? "" : ", ") + x;
    return s;
}

Result<ModelConfig> load_model_config(const std::string& dir) {
    std::string path = dir + "/config.json";
    EXL3_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
    EXL3_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(text, path));
    std::string gen_path = dir + "/generation_config.json";
    if (file_exists(gen_path)) {
        EXL3_ASSIGN_OR_RETURN(std::string gtext, read_text_file(gen_path));
        json g = json::parse(gtext, nullptr, false);
        if (g.is_discarded() || !g.is_object()) return invalid_argument(gen_path + ": not a JSON object");
        std::vector<int> eos;
        EXL3_RETURN_IF_ERROR(parse_token_ids(g, "eos_token_id", gen_path, &eos));
        if (!eos.empty()) mc.eos_token_ids = eos;  // generation_config.json wins, as in transformers' generate()
    }
    return mc;
}

}  // namespace exl3
