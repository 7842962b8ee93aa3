// Tokenizer: loading tokenizer.json and the model directory's configs, and the encode/decode pipelines.
//
// Encoding follows HF: split the input around added tokens that are matched on the raw text, normalize each
// remaining piece, split again around added tokens matched on normalized text, pre-tokenize, run the model on
// each word, then let the post-processor add special tokens.
#include <fmt/core.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "core/mmap.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace exl3 {
namespace tok {

void TokenMatcher::add(const std::string& pattern, int32_t index) {
    if (pattern.empty()) return;
    int32_t node = 0;
    for (char ch : pattern) {
        auto b = static_cast<uint8_t>(ch);
        int32_t child = -1;
        for (auto& [k, v] : nodes_[node].next)
            if (k == b) child = v;
        if (child < 0) {
            child = static_cast<int32_t>(nodes_.size());
            nodes_[node].next.emplace_back(b, child);
            nodes_.emplace_back();
        }
        node = child;
    }
    // A duplicate pattern keeps its first token.
    if (nodes_[node].index < 0) nodes_[node].index = index;
    first_.set(static_cast<uint8_t>(pattern[0]));
}

std::pair<int32_t, size_t> TokenMatcher::longest_at(std::string_view s, size_t pos) const {
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t i = pos; i < s.size(); ++i) {
        auto b = static_cast<uint8_t>(s[i]);
        int32_t child = -1;
        for (auto& [k, v] : nodes_[node].next)
            if (k == b) {
                child = v;
                break;
            }
        if (child < 0) break;
        node = child;
        if (nodes_[node].index >= 0) {
            best = nodes_[node].index;
            best_len = i + 1 - pos;
        }
    }
    return {best, best_len};
}

}  // namespace tok

using tok::json;

void Tokenizer::Impl::split_added(const std::string& text, bool at_origin, const tok::TokenMatcher& matcher,
                                  bool parse_special, std::vector<tok::Segment>& out) const {
    size_t start_offset = 0;
    auto emit_text = [&](size_t a, size_t b) {
        if (a < b) out.push_back(tok::Segment{text.substr(a, b - a), -1, at_origin && a == 0});
    };
    if (!matcher.empty()) {
        size_t i = 0;
        while (i < text.size()) {
            if (!matcher.may_start(static_cast<uint8_t>(text[i]))) {
                ++i;
                continue;
            }
            auto [index, len] = matcher.longest_at(text, i);
            if (index < 0) {
                ++i;
                continue;
            }
            size_t start = i, stop = i + len;
            i = stop;  // matching resumes after the match, whatever is stripped around it
            const tok::AddedToken& t = added[static_cast<size_t>(index)];
            if (!parse_special && t.special) continue;
            if (t.single_word) {
                bool start_ok = start == 0 || !word_end->search(std::string_view(text).substr(0, start));
                bool stop_ok = stop == text.size() || !word_start->search(std::string_view(text).substr(stop));
                if (!start_ok || !stop_ok) continue;
            }
            if (t.lstrip) {
                size_t k = start;
                while (k > 0) {
                    size_t p = k - 1;
                    while (p > 0 && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
                    size_t q = p;
                    if (!tok::is_whitespace(tok::utf8_next(text, q))) break;
                    k = p;
                }
                start = std::max(k, start_offset);
            }
            if (t.rstrip) {
                while (stop < text.size()) {
                    size_t q = stop;
                    if (!tok::is_whitespace(tok::utf8_next(text, q))) break;
                    stop = q;
                }
            }
            start = std::max(start, start_offset);  // a match inside the previous token's stripped space
            emit_text(start_offset, start);
            out.push_back(tok::Segment{std::string(), t.id, false});
            start_offset = stop;
        }
    }
    emit_text(start_offset, text.size());
}

Status Tokenizer::Impl::encode_into(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const {
    thread_local std::vector<tok::Segment> raw_segs, norm_segs;
    thread_local std::vector<tok::Piece> pieces;
    raw_segs.clear();
    split_added(std::string(text), true, raw_matcher, parse_special, raw_segs);
    for (auto& seg : raw_segs) {
        if (seg.id >= 0) {
            ids.push_back(seg.id);
            continue;
        }
        if (normalizer) normalizer->normalize(seg.text);
        norm_segs.clear();
        if (normalized_matcher.empty()) {
            if (!seg.text.empty()) norm_segs.push_back(std::move(seg));
        } else {
            split_added(seg.text, seg.at_origin, normalized_matcher, parse_special, norm_segs);
        }
        for (auto& ns : norm_segs) {
            if (ns.id >= 0) {
                ids.push_back(ns.id);
                continue;
            }
            pieces.clear();
            pieces.push_back(tok::Piece{std::move(ns.text), ns.at_origin});
            if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
            for (auto& p : pieces) EXL3_RETURN_IF_ERROR(model->tokenize(p.text, ids));
        }
    }
    return Status::ok();
}

std::vector<std::string> Tokenizer::Impl::ids_to_tokens(std::span<const int32_t> ids, bool skip_special) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
        auto it = added_by_id.find(id);
        if (it != added_by_id.end()) {
            const tok::AddedToken& t = added[it->second];
            if (skip_special && t.special) continue;
            tokens.push_back(t.content);
            // HF hands a normalized added token to the decoder in its normalized form.
            if (t.normalized && normalizer) normalizer->normalize(tokens.back());
            continue;
        }
        std::string_view s = model->id_to_token(id);
        if (s.empty()) continue;  // unknown id: skipped, as HF does
        if (skip_special) {
            auto ct = added_by_content.find(std::string(s));
            if (ct != added_by_content.end() && added[ct->second].special) continue;
        }
        tokens.emplace_back(s);
    }
    return tokens;
}

// ---- loading

namespace {

Status parse_added_token(const json& j, const std::string& path, tok::AddedToken* t, bool need_id) {
    if (!j.is_object()) return invalid_argument(fmt::format("{} must be an object", path));
    EXL3_RETURN_IF_ERROR(tok::json_string(j, "content", path, &t->content));
    if (t->content.empty()) return invalid_argument(fmt::format("{}.content must not be empty", path));
    if (tok::utf8_find_invalid(t->content) != std::string::npos)
        return invalid_argument(fmt::format("{}.content is not valid UTF-8", path));
    if (need_id) {
        int64_t id = -1;
        EXL3_RETURN_IF_ERROR(tok::json_int(j, "id", path, &id));
        if (id < 0 || id > INT32_MAX - 1) return invalid_argument(fmt::format("{}.id = {} is out of range", path, id));
        t->id = static_cast<int32_t>(id);
    }
    EXL3_RETURN_IF_ERROR(tok::json_bool(j, "special", path, &t->special));
    t->normalized = !t->special;  // HF's default when the field is absent
    EXL3_RETURN_IF_ERROR(tok::json_bool(j, "normalized", path, &t->normalized));
    EXL3_RETURN_IF_ERROR(tok::json_bool(j, "lstrip", path, &t->lstrip));
    EXL3_RETURN_IF_ERROR(tok::json_bool(j, "rstrip", path, &t->rstrip));
    EXL3_RETURN_IF_ERROR(tok::json_bool(j, "single_word", path, &t->single_word));
    return Status::ok();
}

// bos_token/eos_token in tokenizer_config.json: a string, an AddedToken dict, or null.
Status config_token(const json& cfg, const char* key, std::string* out) {
    const json* v = tok::json_member(cfg, key);
    if (!v) return Status::ok();
    if (v->is_string()) {
        *out = v->get<std::string>();
        return Status::ok();
    }
    if (v->is_object()) return tok::json_string(*v, "content", fmt::format("tokenizer_config.json.{}", key), out);
    return invalid_argument(
        fmt::format("tokenizer_config.json.{} must be a string, an object or null, found {}", key, v->type_name()));
}

Result<json> parse_json_text(std::string_view text, const std::string& what) {
    try {
        return json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
        // e.what() carries the byte offset and what the parser expected there.
        return invalid_argument(fmt::format("{} is not valid JSON: {}", what, e.what()));
    }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json,
                                                              std::string_view tokenizer_config_json,
                                                              std::string_view generation_config_json,
                                                              const std::string& origin) {
    EXL3_ASSIGN_OR_RETURN(auto impl, build_impl(tokenizer_json, tokenizer_config_json, generation_config_json, origin));
    return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer::Impl>> Tokenizer::build_impl(std::string_view tokenizer_json,
                                                               std::string_view tokenizer_config_json,
                                                               std::string_view generation_config_json,
                                                               const std::string& origin) {
    auto wrap = [&](Status s) { return s.with_context(origin); };
    auto parsed = parse_json_text(tokenizer_json, "the file");
    if (!parsed) return wrap(parsed.status());
    const json& j = *parsed;
    if (!j.is_object()) return wrap(invalid_argument("the top level must be an object"));
    auto impl = std::make_unique<Impl>();

    const json* model = tok::json_member(j, "model");
    if (!model) return wrap(invalid_argument("\"model\" is missing"));
    {
        auto m = tok::BpeModel::from_json(*model, "model");
        if (!m) return wrap(m.status());
        impl->model = std::move(m).value();
    }
    static const json kNull;
    auto member_or_null = [&](const char* key) -> const json& {
        const json* v = tok::json_member(j, key);
        return v ? *v : kNull;
    };
    {
        auto n = tok::parse_normalizer(member_or_null("normalizer"), "normalizer");
        if (!n) return wrap(n.status());
        impl->normalizer = std::move(n).value();
        auto p = tok::parse_pre_tokenizer(member_or_null("pre_tokenizer"), "pre_tokenizer");
        if (!p) return wrap(p.status());
        impl->pre_tokenizer = std::move(p).value();
        auto pp = tok::parse_post_processor(member_or_null("post_processor"), "post_processor");
        if (!pp) return wrap(pp.status());
        impl->post_processor = std::move(pp).value();
        auto d = tok::parse_decoder(member_or_null("decoder"), "decoder");
        if (!d) return wrap(d.status());
        impl->decoder = std::move(d).value();
    }

    auto add_token = [&](tok::AddedToken t) {
        if (impl->added_by_id.count(t.id)) return;
        impl->added_by_id[t.id] = impl->added.size();
        impl->added_by_content.emplace(t.content, impl->added.size());
        impl->added.push_back(std::move(t));
    };
    if (const json* added = tok::json_member(j, "added_tokens")) {
        if (!added->is_array()) return wrap(invalid_argument("added_tokens must be an array"));
        for (size_t i = 0; i < added->size(); ++i) {
            tok::AddedToken t;
            Status s = parse_added_token((*added)[i], fmt::format("added_tokens[{}]", i), &t, true);
            if (!s) return wrap(s);
            add_token(std::move(t));
        }
    }

    // tokenizer_config.json: BOS/EOS, chat templates, tokens only listed there.
    json cfg = json::object();
    if (!tokenizer_config_json.empty()) {
        auto c = parse_json_text(tokenizer_config_json, "tokenizer_config.json");
        if (!c) return c.status();
        if (!c->is_object()) return invalid_argument("tokenizer_config.json: the top level must be an object");
        cfg = std::move(c).value();
    }
    if (const json* dec = tok::json_member(cfg, "added_tokens_decoder")) {
        if (!dec->is_object()) return invalid_argument("tokenizer_config.json.added_tokens_decoder must be an object");
        for (auto it = dec->begin(); it != dec->end(); ++it) {
            std::string path = fmt::format("tokenizer_config.json.added_tokens_decoder[\"{}\"]", it.key());
            char* end = nullptr;
            long id = std::strtol(it.key().c_str(), &end, 10);
            if (it.key().empty() || *end != '\0' || id < 0 || id > INT32_MAX - 1)
                return invalid_argument(fmt::format("{}: the key must be a token id", path));
            tok::AddedToken t;
            EXL3_RETURN_IF_ERROR(parse_added_token(it.value(), path, &t, false));
            t.id = static_cast<int32_t>(id);
            add_token(std::move(t));
        }
    }
    EXL3_RETURN_IF_ERROR(config_token(cfg, "bos_token", &impl->bos_token));
    EXL3_RETURN_IF_ERROR(config_token(cfg, "eos_token", &impl->eos_token));

    // Matchers and lookup sets. Normalized tokens are matched in their normalized form.
    for (size_t i = 0; i < impl->added.size(); ++i) {
        const tok::AddedToken& t = impl->added[i];
        if (t.normalized) {
            std::string s = t.content;
            if (impl->normalizer) impl->normalizer->normalize(s);
            impl->normalized_matcher.add(s, static_cast<int32_t>(i));
        } else {
            impl->raw_matcher.add(t.content, static_cast<int32_t>(i));
        }
    }
    {
        auto ws = tok::Regex::compile(R"(\A\w)");
        auto we = tok::Regex::compile(R"(\w\z)");
        if (!ws || !we) return internal_error("the single_word patterns do not compile");
        impl->word_start = *ws;
        impl->word_end = *we;
    }

    auto lookup = [&](const std::string& s) -> int32_t {
        if (s.empty()) return -1;
        auto it = impl->added_by_content.find(s);
        if (it != impl->added_by_content.end()) return impl->added[it->second].id;
        auto id = impl->model->token_to_id(s);
        return id ? *id : -1;
    };
    impl->bos_id = lookup(impl->bos_token);
    impl->eos_id = lookup(impl->eos_token);
    if (!impl->bos_token.empty() && impl->bos_id < 0)
        return invalid_argument(
            fmt::format("tokenizer_config.json.bos_token \"{}\" is not a token of {}", impl->bos_token, origin));
    if (!impl->eos_token.empty() && impl->eos_id < 0)
        return invalid_argument(
            fmt::format("tokenizer_config.json.eos_token \"{}\" is not a token of {}", impl->eos_token, origin));

    // generation_config.json: eos_token_id (int or list) and bos_token_id.
    if (!generation_config_json.empty()) {
        auto g = parse_json_text(generation_config_json, "generation_config.json");
        if (!g) return g.status();
        if (!g->is_object()) return invalid_argument("generation_config.json: the top level must be an object");
        if (const json* e = tok::json_member(*g, "eos_token_id")) {
            std::vector<const json*> items;
            if (e->is_array())
                for (auto& v : *e) items.push_back(&v);
            else
                items.push_back(e);
            for (const json* v : items) {
                if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > INT32_MAX)
                    return invalid_argument("generation_config.json.eos_token_id must be a token id or a list of them");
                impl->eos_ids.push_back(v->get<int32_t>());
            }
        }
        if (const json* b = tok::json_member(*g, "bos_token_id"); b && impl->bos_id < 0) {
            if (!b->is_number_integer() || b->get<int64_t>() < 0 || b->get<int64_t>() > INT32_MAX)
                return invalid_argument("generation_config.json.bos_token_id must be a token id");
            impl->bos_id = b->get<int32_t>();
        }
    }
    if (impl->eos_id < 0 && !impl->eos_ids.empty()) impl->eos_id = impl->eos_ids[0];
    if (impl->eos_id >= 0 && std::find(impl->eos_ids.begin(), impl->eos_ids.end(), impl->eos_id) == impl->eos_ids.end())
        impl->eos_ids.insert(impl->eos_ids.begin(), impl->eos_id);
    if (impl->bos_token.empty() && impl->bos_id >= 0) {
        auto it = impl->added_by_id.find(impl->bos_id);
        impl->bos_token = it != impl->added_by_id.end() ? impl->added[it->second].content
                                                        : std::string(impl->model->id_to_token(impl->bos_id));
    }
    if (impl->eos_token.empty() && impl->eos_id >= 0) {
        auto it = impl->added_by_id.find(impl->eos_id);
        impl->eos_token = it != impl->added_by_id.end() ? impl->added[it->second].content
                                                        : std::string(impl->model->id_to_token(impl->eos_id));
    }

    // add_bos_token/add_eos_token: transformers rebuilds the post-processor as [bos] $A [eos] from them. A key
    // that is absent keeps what tokenizer.json's post-processor does, and when nothing changes that one is kept.
    const json* add_bos_j = tok::json_member(cfg, "add_bos_token");
    const json* add_eos_j = tok::json_member(cfg, "add_eos_token");
    if (add_bos_j || add_eos_j) {
        std::vector<int32_t> probe;
        if (impl->post_processor) impl->post_processor->process(probe, true);
        bool had_bos = !probe.empty() && impl->bos_id >= 0 && probe.front() == impl->bos_id;
        bool had_eos = !probe.empty() && impl->eos_id >= 0 && probe.back() == impl->eos_id;
        bool add_bos = had_bos, add_eos = had_eos;
        if (add_bos_j) {
            if (!add_bos_j->is_boolean())
                return invalid_argument("tokenizer_config.json.add_bos_token must be true or false");
            add_bos = add_bos_j->get<bool>();
        }
        if (add_eos_j) {
            if (!add_eos_j->is_boolean())
                return invalid_argument("tokenizer_config.json.add_eos_token must be true or false");
            add_eos = add_eos_j->get<bool>();
        }
        if (add_bos && impl->bos_id < 0)
            return invalid_argument("tokenizer_config.json: add_bos_token is true but there is no bos_token");
        if (add_eos && impl->eos_id < 0)
            return invalid_argument("tokenizer_config.json: add_eos_token is true but there is no eos_token");
        std::vector<int32_t> want;
        if (add_bos) want.push_back(impl->bos_id);
        if (add_eos) want.push_back(impl->eos_id);
        if (want != probe)
            impl->post_processor =
                tok::make_bos_eos_processor(add_bos ? impl->bos_id : -1, add_eos ? impl->eos_id : -1);
    }

    if (const json* ct = tok::json_member(cfg, "chat_template")) {
        if (ct->is_string()) {
            impl->chat_templates.push_back(NamedChatTemplate{"default", ct->get<std::string>()});
        } else if (ct->is_array()) {
            for (size_t i = 0; i < ct->size(); ++i) {
                NamedChatTemplate t;
                std::string path = fmt::format("tokenizer_config.json.chat_template[{}]", i);
                EXL3_RETURN_IF_ERROR(tok::json_string((*ct)[i], "name", path, &t.name));
                EXL3_RETURN_IF_ERROR(tok::json_string((*ct)[i], "template", path, &t.source));
                impl->chat_templates.push_back(std::move(t));
            }
        } else {
            return invalid_argument(
                "tokenizer_config.json.chat_template must be a string or a list of {name, template}");
        }
    }

    // Vocabulary size as HF counts it: distinct tokens of the model and the added tokens.
    impl->vocab_size = impl->model->size();
    impl->id_space = impl->model->tokens_by_id().size();
    for (auto& t : impl->added) {
        auto mid = impl->model->token_to_id(t.content);
        if (!mid) impl->vocab_size++;
        impl->id_space = std::max(impl->id_space, static_cast<size_t>(t.id) + 1);
    }
    if (impl->model->byte_fallback()) {
        impl->is_byte_token.assign(impl->id_space, false);
        for (int b = 0; b < 256; ++b) {
            int32_t id = impl->model->byte_id(static_cast<uint8_t>(b));
            if (id >= 0 && !impl->added_by_id.count(id)) impl->is_byte_token[static_cast<size_t>(id)] = true;
        }
    }
    return impl;
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        return not_found(
            fmt::format("{}: no such file or directory (expected a model directory or tokenizer.json)", path));
    std::string dir, file;
    if (S_ISDIR(st.st_mode)) {
        dir = path;
        file = path + "/tokenizer.json";
        if (!file_exists(file))
            return not_found(
                fmt::format("{} has no tokenizer.json (only BPE tokenizers in HF's tokenizer.json format "
                            "are supported)",
                            path));
    } else {
        file = path;
        size_t slash = path.rfind('/');
        dir = slash == std::string::npos ? "." : path.substr(0, slash);
    }
    EXL3_ASSIGN_OR_RETURN(std::string text, read_text_file(file));
    std::string cfg, gen;
    std::string cfg_path = dir + "/tokenizer_config.json", gen_path = dir + "/generation_config.json";
    if (file_exists(cfg_path)) {
        EXL3_ASSIGN_OR_RETURN(cfg, read_text_file(cfg_path));
    }
    if (file_exists(gen_path)) {
        EXL3_ASSIGN_OR_RETURN(gen, read_text_file(gen_path));
    }
    // Newer checkpoints keep the template beside the config rather than in it.
    std::string jinja;
    std::string jinja_path = dir + "/chat_template.jinja";
    if (file_exists(jinja_path)) {
        EXL3_ASSIGN_OR_RETURN(jinja, read_text_file(jinja_path));
    }
    auto impl = build_impl(text, cfg, gen, file);
    if (!impl) return impl.status().with_context(dir);
    if (!jinja.empty() && std::none_of((*impl)->chat_templates.begin(), (*impl)->chat_templates.end(),
                                       [](const NamedChatTemplate& t) { return t.name == "default"; }))
        (*impl)->chat_templates.push_back(NamedChatTemplate{"default", std::move(jinja)});
    return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl).value()));
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                               bool parse_special) const {
    size_t bad = tok::utf8_find_invalid(text);
    if (bad != std::string_view::npos)
        return invalid_argument(fmt::format("encode: the text is not valid UTF-8 (byte 0x{:02X} at offset {})",
                                            static_cast<uint8_t>(text[bad]), bad));
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    EXL3_RETURN_IF_ERROR(impl_->encode_into(text, parse_special, ids));
    if (impl_->post_processor) impl_->post_processor->process(ids, add_special_tokens);
    return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    std::vector<std::string> tokens = impl_->ids_to_tokens(ids, skip_special_tokens);
    std::string out;
    if (impl_->decoder) {
        impl_->decoder->decode_chain(tokens);
        for (auto& t : tokens) out += t;
    } else {
        for (size_t i = 0; i < tokens.size(); ++i) {
            if (i) out.push_back(' ');
            out += tokens[i];
        }
    }
    return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
    auto it = impl_->added_by_content.find(std::string(token));
    if (it != impl_->added_by_content.end()) return impl_->added[it->second].id;
    return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
    auto it = impl_->added_by_id.find(id);
    if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
    std::string_view s = impl_->model->id_to_token(id);
    if (s.empty()) return std::nullopt;
    return std::string(s);
}

size_t Tokenizer::vocab_size() const {
    return impl_->vocab_size;
}
size_t Tokenizer::id_space() const {
    return impl_->id_space;
}
bool Tokenizer::is_special(int32_t id) const {
    auto it = impl_->added_by_id.find(id);
    return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}
int32_t Tokenizer::bos_id() const {
    return impl_->bos_id;
}
int32_t Tokenizer::eos_id() const {
    return impl_->eos_id;
}
const std::vector<int32_t>& Tokenizer::eos_ids() const {
    return impl_->eos_ids;
}
const std::string& Tokenizer::bos_token() const {
    return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
    return impl_->eos_token;
}

const std::string* Tokenizer::chat_template(std::string_view name) const {
    for (auto& t : impl_->chat_templates)
        if (t.name == name) return &t.source;
    return nullptr;
}
const std::vector<NamedChatTemplate>& Tokenizer::chat_templates() const {
    return impl_->chat_templates;
}

}  // namespace exl3
