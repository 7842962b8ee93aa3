// The Python module's native part (`exl3._exl3`): pybind11 bindings over the public headers (include/exl3) only.
// python/exl3/__init__.py builds the user-facing package on top (Generator.generate / stream / chat, Completion).
//
// Errors: a failed Status becomes an exception of the class for its code (exl3.InvalidArgumentError is also a
// ValueError, NotFoundError a LookupError, IoError an OSError; all are exl3.Error). Long calls (loading, forward,
// generation steps) release the GIL, so other Python threads run meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "exl3/chat_template.h"
#include "exl3/generator.h"
#include "exl3/model.h"
#include "exl3/status.h"
#include "exl3/tokenizer.h"
#include "exl3/chat_reply.h"
#include "exl3/tool_calls.h"

namespace py = pybind11;

namespace exl3::python {
namespace {

// The exception classes, created at import (make_errors).
struct Errors {
    PyObject* base = nullptr;
    PyObject* invalid_argument = nullptr;
    PyObject* not_found = nullptr;
    PyObject* unsupported = nullptr;
    PyObject* io = nullptr;
    PyObject* out_of_range = nullptr;
    PyObject* internal = nullptr;
};
Errors g_errors;

PyObject* error_class(const Status& s) {
    PyObject* cls = g_errors.internal;
    switch (s.code()) {
        case StatusCode::kInvalidArgument:
            cls = g_errors.invalid_argument;
            break;
        case StatusCode::kNotFound:
            cls = g_errors.not_found;
            break;
        case StatusCode::kUnsupported:
            cls = g_errors.unsupported;
            break;
        case StatusCode::kIoError:
            cls = g_errors.io;
            break;
        case StatusCode::kOutOfRange:
            cls = g_errors.out_of_range;
            break;
        default:
            break;
    }
    return cls;
}

[[noreturn]] void raise(const Status& s) {
    PyErr_SetString(error_class(s), s.message().c_str());
    throw py::error_already_set();
}

void check(const Status& s) {
    if (!s.is_ok()) raise(s);
}

template <typename T>
T take(Result<T> r) {
    if (!r.is_ok()) raise(r.status());
    return std::move(*r);
}

PyObject* new_error(py::module_& m, const char* name, PyObject* base, PyObject* also, const char* doc) {
    py::tuple bases = also ? py::make_tuple(py::handle(base), py::handle(also)) : py::make_tuple(py::handle(base));
    const std::string qualified = std::string("exl3.") + name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
    if (!cls) throw py::error_already_set();
    m.attr(name) = py::handle(cls);
    return cls;
}

void make_errors(py::module_& m) {
    g_errors.base = PyErr_NewExceptionWithDoc("exl3.Error", "An exl3 call failed; the message says what and where.",
                                              PyExc_Exception, nullptr);
    if (!g_errors.base) throw py::error_already_set();
    m.attr("Error") = py::handle(g_errors.base);
    g_errors.invalid_argument =
        new_error(m, "InvalidArgumentError", g_errors.base, PyExc_ValueError,
                  "Bad input from the caller or a file: malformed, inconsistent, out of range.");
    g_errors.not_found = new_error(m, "NotFoundError", g_errors.base, PyExc_LookupError,
                                   "A file, tensor, key or job that should exist does not.");
    g_errors.unsupported = new_error(m, "UnsupportedError", g_errors.base, nullptr,
                                     "Well-formed but not handled (an unknown architecture, RoPE type or dtype).");
    g_errors.io = new_error(m, "IoError", g_errors.base, PyExc_OSError, "The operating system refused a file.");
    g_errors.out_of_range = new_error(m, "OutOfRangeError", g_errors.base, nullptr,
                                      "A request exceeds a limit (the context length, the KV cache).");
    g_errors.internal = new_error(m, "InternalError", g_errors.base, nullptr, "A bug in exl3: please report it.");
}

// Python owns these wrappers; the C++ objects inside are what the library hands out.
struct PyTokenizer {
    std::shared_ptr<const Tokenizer> tok;
    // Chat templates parsed on first use, by name (touched with the GIL held only).
    std::unordered_map<std::string, std::shared_ptr<const ChatTemplate>> templates;
};

struct PyModel {
    std::unique_ptr<Model> model;
    const Model& get() const { return *model; }
};

struct PySequence {
    std::shared_ptr<PyModel> owner;  // the model outlives its sequences
    std::unique_ptr<Sequence> seq;
};

// Logits rows [rows, vocab] as fp32, readable through the buffer protocol (memoryview, numpy.asarray) or as lists.
struct Logits {
    std::vector<float> data;
    py::ssize_t rows = 0;
    py::ssize_t vocab = 0;

    py::ssize_t row_index(py::ssize_t i) const {
        if (i < 0) i += rows;
        if (i < 0 || i >= rows)
            throw py::index_error("logits row " + std::to_string(i) + " of " + std::to_string(rows));
        return i;
    }
    std::vector<float> row(py::ssize_t i) const {
        const float* p = data.data() + row_index(i) * vocab;
        return {p, p + vocab};
    }
    int argmax(py::ssize_t i) const {
        const float* p = data.data() + row_index(i) * vocab;
        int best = 0;
        for (py::ssize_t j = 1; j < vocab; ++j)
            if (p[j] > p[best]) best = static_cast<int>(j);
        return best;
    }
};

// Token ids from Python: each must fit int32 (the library checks them against the vocabulary).
std::vector<int32_t> to_ids(const std::vector<int64_t>& v, const char* what) {
    std::vector<int32_t> out;
    out.reserve(v.size());
    for (int64_t x : v) {
        if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
            raise(invalid_argument(std::string(what) + ": token id " + std::to_string(x) + " is out of range"));
        out.push_back(static_cast<int32_t>(x));
    }
    return out;
}

// A str as UTF-8; a lone surrogate (not encodable) raises UnicodeEncodeError instead of a cast error.
std::string utf8(py::handle h, const char* what) {
    if (!py::isinstance<py::str>(h))
        throw py::type_error(std::string("exl3: ") + what + " must be a str, not " +
                             std::string(py::str(py::type::of(h))));
    Py_ssize_t n = 0;
    const char* p = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
    if (!p) throw py::error_already_set();
    return {p, static_cast<size_t>(n)};
}

// generate / submit keyword arguments: the request's own fields and every SamplerSettings field, by name.
using Setter = std::function<void(GenerationRequest&, py::handle)>;

template <typename T>
T cast_arg(py::handle h, const std::string& name) {
    try {
        return h.cast<T>();
    } catch (const py::cast_error&) {
        throw py::type_error("exl3: '" + name + "' has the wrong type (" + std::string(py::str(py::type::of(h))) + ")");
    }
}

const std::unordered_map<std::string, Setter>& request_setters() {
    static const auto* table = [] {
        auto* t = new std::unordered_map<std::string, Setter>;
        auto& s = *t;
#define EXL3_SAMPLER_FIELD(field)                                           \
    s[#field] = [](GenerationRequest& r, py::handle h) {                    \
        r.sampling.field = cast_arg<decltype(r.sampling.field)>(h, #field); \
    }
        EXL3_SAMPLER_FIELD(temperature);
        EXL3_SAMPLER_FIELD(top_k);
        EXL3_SAMPLER_FIELD(top_p);
        EXL3_SAMPLER_FIELD(min_p);
        EXL3_SAMPLER_FIELD(typical_p);
        EXL3_SAMPLER_FIELD(repetition_penalty);
        EXL3_SAMPLER_FIELD(presence_penalty);
        EXL3_SAMPLER_FIELD(frequency_penalty);
        EXL3_SAMPLER_FIELD(penalty_window);
        EXL3_SAMPLER_FIELD(dry_multiplier);
        EXL3_SAMPLER_FIELD(dry_base);
        EXL3_SAMPLER_FIELD(dry_allowed_length);
        EXL3_SAMPLER_FIELD(dry_penalty_window);
        EXL3_SAMPLER_FIELD(dry_sequence_breakers);
        EXL3_SAMPLER_FIELD(xtc_threshold);
        EXL3_SAMPLER_FIELD(xtc_probability);
#undef EXL3_SAMPLER_FIELD
        s["seed"] = [](GenerationRequest& r, py::handle h) {
            const auto v = cast_arg<int64_t>(h, "seed");
            if (v < 0) raise(invalid_argument("seed must be >= 0"));
            r.sampling.seed = static_cast<uint64_t>(v);
        };
        s["banned_tokens"] = [](GenerationRequest& r, py::handle h) {
            r.sampling.banned_tokens = to_ids(cast_arg<std::vector<int64_t>>(h, "banned_tokens"), "banned_tokens");
        };
        s["logit_bias"] = [](GenerationRequest& r, py::handle h) {  // {token: bias}
            const auto d = cast_arg<std::unordered_map<int64_t, float>>(h, "logit_bias");
            r.sampling.logit_bias.clear();
            for (const auto& [id, bias] : d) r.sampling.logit_bias.emplace_back(to_ids({id}, "logit_bias")[0], bias);
        };
        s["max_new_tokens"] = [](GenerationRequest& r, py::handle h) {
            r.max_new_tokens = cast_arg<int>(h, "max_new_tokens");
        };
        s["stop"] = [](GenerationRequest& r, py::handle h) {  // a string or a list of strings
            if (py::isinstance<py::str>(h))
                r.stop_strings = {h.cast<std::string>()};
            else
                r.stop_strings = cast_arg<std::vector<std::string>>(h, "stop");
        };
        s["stop_ids"] = [](GenerationRequest& r, py::handle h) {
            r.stop_ids = to_ids(cast_arg<std::vector<int64_t>>(h, "stop_ids"), "stop_ids");
        };
        s["ignore_eos"] = [](GenerationRequest& r, py::handle h) { r.ignore_eos = cast_arg<bool>(h, "ignore_eos"); };
        s["json"] = [](GenerationRequest& r, py::handle h) { r.json_object = cast_arg<bool>(h, "json"); };
        s["json_schema"] = [](GenerationRequest& r, py::handle h) {  // a dict (serialised here) or its JSON text
            if (h.is_none()) return;
            if (py::isinstance<py::str>(h))
                r.json_schema = h.cast<std::string>();
            else if (py::isinstance<py::dict>(h))
                r.json_schema = py::module_::import("json").attr("dumps")(h).cast<std::string>();
            else
                raise(invalid_argument("json_schema must be a dict or a JSON string"));
        };
        s["skip_special_tokens"] = [](GenerationRequest& r, py::handle h) {
            r.skip_special_tokens = cast_arg<bool>(h, "skip_special_tokens");
        };
        s["logprobs"] = [](GenerationRequest& r, py::handle h) {  // None: off; 0: the chosen token's; n: top n too
            r.logprobs = h.is_none() ? -1 : cast_arg<int>(h, "logprobs");
            if (r.logprobs < -1) raise(invalid_argument("logprobs must be None or >= 0"));
        };
        s["add_special_tokens"] = [](GenerationRequest& r, py::handle h) {
            r.add_special_tokens = cast_arg<bool>(h, "add_special_tokens");
        };
        // A list of {"literal": str, "json_schema": dict or str} (GenerationRequest::choices), and its trigger.
        s["choices"] = [](GenerationRequest& r, py::handle h) {
            r.choices.clear();
            for (py::handle c : cast_arg<py::list>(h, "choices")) {
                const auto d = cast_arg<py::dict>(c, "choices[i]");
                if (!d.contains("literal") || !d.contains("json_schema"))
                    raise(invalid_argument("each of 'choices' needs 'literal' and 'json_schema'"));
                GenerationRequest::Choice choice;
                choice.literal = cast_arg<std::string>(d["literal"], "choices[i].literal");
                py::handle schema = d["json_schema"];
                choice.json_schema = py::isinstance<py::str>(schema)
                                         ? schema.cast<std::string>()
                                         : py::module_::import("json").attr("dumps")(schema).cast<std::string>();
                r.choices.push_back(std::move(choice));
            }
        };
        s["choices_trigger"] = [](GenerationRequest& r, py::handle h) {
            r.choices_trigger = cast_arg<std::string>(h, "choices_trigger");
        };
        // A dict of GenerationRequest::Reasoning's fields (what Generator.chat builds with exl3.reasoning_settings).
        s["reasoning"] = [](GenerationRequest& r, py::handle h) {
            const auto d = cast_arg<py::dict>(h, "reasoning");
            for (const auto& [key, value] : d) {
                const std::string k = py::str(key);
                if (k == "open") r.reasoning.open = cast_arg<std::string>(value, "reasoning.open");
                else if (k == "close") r.reasoning.close = cast_arg<std::string>(value, "reasoning.close");
                else if (k == "closing") r.reasoning.closing = cast_arg<std::string>(value, "reasoning.closing");
                else if (k == "open_anywhere") r.reasoning.open_anywhere = cast_arg<bool>(value, "reasoning." + k);
                else if (k == "starts_inside") r.reasoning.starts_inside = cast_arg<bool>(value, "reasoning." + k);
                else if (k == "max_tokens") r.reasoning.max_tokens = cast_arg<int>(value, "reasoning.max_tokens");
                else throw py::type_error("exl3: 'reasoning' has no field '" + k + "'");
            }
        };
        return t;
    }();
    return *table;
}

GenerationRequest make_request(py::handle prompt, const py::kwargs& kw) {
    GenerationRequest r;
    if (py::isinstance<py::str>(prompt))
        r.prompt_text = utf8(prompt, "prompt");
    else if (py::isinstance<py::bytes>(prompt))
        throw py::type_error("exl3: the prompt is text (str) or token ids (a list of int), not bytes");
    else
        r.prompt_ids = to_ids(cast_arg<std::vector<int64_t>>(prompt, "prompt"), "prompt");
    const auto& setters = request_setters();
    for (const auto& [key, value] : kw) {
        const std::string name = py::str(key);
        auto it = setters.find(name);
        if (it == setters.end()) throw py::type_error("exl3: unexpected keyword argument '" + name + "'");
        if (value.is_none() && name != "logprobs") continue;  // None: the default
        it->second(r, value);
    }
    return r;
}

py::object finish_name(FinishReason f) {
    if (f == FinishReason::kNone) return py::none();
    return py::str(finish_reason_name(f));
}

py::dict model_info_dict(const ModelInfo& i) {
    py::dict d;
    d["architecture"] = i.architecture;
    d["dtype"] = i.dtype;
    d["rope_type"] = i.rope_type;
    d["vocab_size"] = i.vocab_size;
    d["hidden_size"] = i.hidden_size;
    d["intermediate_size"] = i.intermediate_size;
    d["num_layers"] = i.num_layers;
    d["num_heads"] = i.num_heads;
    d["num_kv_heads"] = i.num_kv_heads;
    d["head_dim"] = i.head_dim;
    d["context_length"] = i.context_length;
    d["bos_token_id"] = i.bos_token_id;
    d["eos_token_ids"] = i.eos_token_ids;
    d["num_parameters"] = i.num_parameters;
    d["tied_embeddings"] = i.tied_embeddings;
    d["weight_bytes"] = i.weight_bytes;
    d["quantization"] = i.quantization;
    d["kv_bits_k"] = i.kv_bits_k;
    d["kv_bits_v"] = i.kv_bits_v;
    d["kv_bytes_per_token"] = i.kv_bytes_per_token;
    d["cache_tokens"] = i.cache_tokens;
    return d;
}

py::dict cache_stats_dict(const CacheStats& c) {
    py::dict d;
    d["page_size"] = c.page_size;
    d["pages"] = c.pages;
    d["pages_in_use"] = c.pages_in_use;
    d["pages_cached"] = c.pages_cached;
    d["pages_free"] = c.pages_free;
    d["pages_evicted"] = c.pages_evicted;
    d["tokens_computed"] = c.tokens_computed;
    d["tokens_reused"] = c.tokens_reused;
    return d;
}

struct PyGenerator {
    std::shared_ptr<PyModel> model;  // kept alive while the generator lives
    std::shared_ptr<PyTokenizer> tokenizer;
    std::shared_ptr<PyModel> draft;  // speculative decoding's draft model, when one is given
    std::unique_ptr<Generator> gen;
};

Status no_template(const std::string& name) {
    return not_found(name == "default" ? std::string("this tokenizer has no chat template")
                                       : "this tokenizer has no chat template named '" + name + "'");
}

// exl3.Tokenizer: tokenizer.json with the model directory's configs, and the chat templates it carries.
void bind_tokenizer(py::module_& m) {
    py::class_<PyTokenizer, std::shared_ptr<PyTokenizer>>(m, "Tokenizer",
                                                          "A Hugging Face tokenizer.json with the model directory's "
                                                          "tokenizer_config.json and generation_config.json.")
        .def(py::init([](const std::string& path) {
                 std::shared_ptr<const Tokenizer> t;
                 {
                     py::gil_scoped_release nogil;
                     auto r = Tokenizer::load(path);
                     if (!r.is_ok()) {
                         py::gil_scoped_acquire gil;
                         raise(r.status());
                     }
                     t = std::move(*r);
                 }
                 auto pt = std::make_shared<PyTokenizer>();
                 pt->tok = std::move(t);
                 return pt;
             }),
             py::arg("path"), "Loads a model directory's tokenizer, or a tokenizer.json file.")
        .def(
            "encode",
            [](const PyTokenizer& t, py::handle text, bool add_special_tokens, bool parse_special) {
                return take(t.tok->encode(utf8(text, "text"), add_special_tokens, parse_special));
            },
            py::arg("text"), py::arg("add_special_tokens") = true, py::arg("parse_special") = true,
            "Text to token ids. add_special_tokens: BOS/EOS as tokenizer_config.json asks; parse_special: special "
            "tokens written in the text become their ids.")
        .def(
            "decode",
            [](const PyTokenizer& t, const std::vector<int64_t>& ids, bool skip_special_tokens) {
                const auto v = to_ids(ids, "decode");
                return t.tok->decode(v, skip_special_tokens);
            },
            py::arg("ids"), py::arg("skip_special_tokens") = false,
            "Token ids to text (unknown ids are skipped; invalid byte sequences become U+FFFD).")
        .def(
            "token_to_id",
            [](const PyTokenizer& t, const std::string& s) -> std::optional<int32_t> { return t.tok->token_to_id(s); },
            py::arg("token"))
        .def(
            "id_to_token",
            [](const PyTokenizer& t, int64_t id) -> std::optional<std::string> {
                if (id < 0 || id > std::numeric_limits<int32_t>::max()) return std::nullopt;
                return t.tok->id_to_token(static_cast<int32_t>(id));
            },
            py::arg("id"))
        .def(
            "is_special", [](const PyTokenizer& t, int32_t id) { return t.tok->is_special(id); }, py::arg("id"))
        .def_property_readonly("vocab_size", [](const PyTokenizer& t) { return t.tok->vocab_size(); })
        .def_property_readonly("bos_id",
                               [](const PyTokenizer& t) -> std::optional<int32_t> {
                                   const int32_t id = t.tok->bos_id();
                                   return id < 0 ? std::nullopt : std::optional<int32_t>(id);
                               })
        .def_property_readonly("eos_id",
                               [](const PyTokenizer& t) -> std::optional<int32_t> {
                                   const int32_t id = t.tok->eos_id();
                                   return id < 0 ? std::nullopt : std::optional<int32_t>(id);
                               })
        .def_property_readonly("eos_ids", [](const PyTokenizer& t) { return t.tok->eos_ids(); })
        .def_property_readonly("bos_token", [](const PyTokenizer& t) { return t.tok->bos_token(); })
        .def_property_readonly("eos_token", [](const PyTokenizer& t) { return t.tok->eos_token(); })
        .def(
            "chat_template",
            [](const PyTokenizer& t, const std::string& name) -> std::optional<std::string> {
                const std::string* s = t.tok->chat_template(name);
                return s ? std::optional<std::string>(*s) : std::nullopt;
            },
            py::arg("name") = "default", "The chat template of that name, or None.")
        .def_property_readonly("chat_template_names",
                               [](const PyTokenizer& t) {
                                   std::vector<std::string> names;
                                   for (const auto& c : t.tok->chat_templates()) names.push_back(c.name);
                                   return names;
                               })
        .def(
            "tool_call_format",
            [](const PyTokenizer& t, const std::string& name) {
                const std::string* source = t.tok->chat_template(name);
                if (!source) raise(no_template(name));
                return tool_call_format(*source);
            },
            py::arg("name") = "default",
            "How the chat template of that name teaches its model to write tool calls: 'hermes', 'llama3', "
            "'mistral', 'mistral-args', 'granite', 'command-r', 'command-r-plus', 'seed', 'qwen3-coder', 'glm', "
            "'harmony' or 'gemma' (what exl3.parse_tool_calls takes).")
        .def(
            "reply_format",
            [](const PyTokenizer& t, const std::string& name) {
                const std::string* source = t.tok->chat_template(name);
                if (!source) raise(no_template(name));
                const ReplyFormat f = reply_format(*source, [&](std::string_view text) {
                    return t.tok->token_to_id(text).has_value();
                });
                py::dict d;
                d["tools"] = f.tools;
                d["reasoning"] = f.reasoning;
                d["reasoning_open"] = f.reasoning_open;
                d["reasoning_close"] = f.reasoning_close;
                return d;
            },
            py::arg("name") = "default",
            "How the chat template of that name's model writes replies: {'tools': its tool-call format, "
            "'reasoning': 'none', 'tags' or 'harmony', 'reasoning_open', 'reasoning_close'} (markers found in the "
            "template and the vocabulary).")
        .def(
            "_render_chat",
            [](PyTokenizer& t, const std::string& context_json, const std::string& name) {
                const std::string* source = t.tok->chat_template(name);
                if (!source) raise(no_template(name));
                nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(context_json, nullptr, false);
                if (ctx.is_discarded() || !ctx.is_object())
                    raise(invalid_argument("the chat context is not a JSON object"));
                ctx["bos_token"] = t.tok->bos_token();
                ctx["eos_token"] = t.tok->eos_token();
                auto& tmpl = t.templates[name];
                if (!tmpl) tmpl = std::make_shared<const ChatTemplate>(take(ChatTemplate::parse(*source)));
                auto text = tmpl->render(ctx);
                if (!text.is_ok()) raise(text.status().with_context("rendering the chat template"));
                return std::move(*text);
            },
            py::arg("context_json"), py::arg("name") = "default");
}

// exl3.Logits: fp32 rows through the buffer protocol.
void bind_logits(py::module_& m) {
    py::class_<Logits>(
        m, "Logits", py::buffer_protocol(),
        "fp32 logits [rows, vocab]: memoryview(l), numpy.asarray(l), l[i] (a row as a list), l.tolist().")
        .def_buffer([](Logits& l) {
            return py::buffer_info(
                l.data.data(), sizeof(float), py::format_descriptor<float>::format(), 2, {l.rows, l.vocab},
                {static_cast<py::ssize_t>(sizeof(float)) * l.vocab, static_cast<py::ssize_t>(sizeof(float))},
                /*readonly=*/true);
        })
        .def_property_readonly("shape", [](const Logits& l) { return py::make_tuple(l.rows, l.vocab); })
        .def("__len__", [](const Logits& l) { return l.rows; })
        .def("__getitem__", &Logits::row, py::arg("row"))
        .def("tolist",
             [](const Logits& l) {
                 std::vector<std::vector<float>> out;
                 for (py::ssize_t i = 0; i < l.rows; ++i) out.push_back(l.row(i));
                 return out;
             })
        .def("argmax", &Logits::argmax, py::arg("row") = -1, "The most likely token id of a row (the last by default).")
        .def("__repr__", [](const Logits& l) {
            return "<exl3.Logits rows=" + std::to_string(l.rows) + " vocab=" + std::to_string(l.vocab) + ">";
        });
}

// The GPU memory keywords of Model() and plan_memory().
struct MemoryArgs {
    std::optional<double> gpu_memory;  // GiB
    int max_step_tokens = 0;
    int offload_layers = 0;
    std::string offload_mode = "stream";
    int offload_experts = 0;
    bool embed_on_gpu = false;
};

LoadOptions load_options(const std::string& device, int threads, int context_length, int cache_tokens, int page_size,
                         bool prefix_cache, int kv_bits, std::optional<int> kv_bits_k, std::optional<int> kv_bits_v,
                         bool batch_invariant, const MemoryArgs& mem) {
    LoadOptions o;
    o.device = device;
    o.threads = threads;
    o.context_length = context_length;
    o.cache_tokens = cache_tokens;
    o.page_size = page_size;
    o.prefix_cache = prefix_cache;
    o.kv_bits_k = kv_bits_k.value_or(kv_bits);
    o.kv_bits_v = kv_bits_v.value_or(kv_bits);
    o.batch_invariant = batch_invariant;
    if (mem.gpu_memory) {
        if (!(*mem.gpu_memory > 0)) raise(invalid_argument("gpu_memory must be a positive number of GiB"));
        o.gpu_memory = static_cast<int64_t>(*mem.gpu_memory * 1024.0 * 1024.0 * 1024.0);
    }
    o.max_step_tokens = mem.max_step_tokens;
    o.offload_layers = mem.offload_layers;
    if (mem.offload_mode != "stream" && mem.offload_mode != "cpu")
        raise(invalid_argument("offload_mode must be 'stream' or 'cpu', not '" + mem.offload_mode + "'"));
    o.offload_mode = mem.offload_mode == "cpu" ? OffloadMode::kCpu : OffloadMode::kStream;
    o.offload_experts = mem.offload_experts;
    o.embed_on_gpu = mem.embed_on_gpu;
    return o;
}

py::dict memory_plan_dict(const MemoryPlan& p) {
    py::dict d;
    auto items = [](const std::vector<MemoryItem>& v) {
        py::list l;
        for (const auto& i : v) {
            py::dict e;
            e["name"] = i.name;
            e["detail"] = i.detail;
            e["bytes"] = i.bytes;
            l.append(e);
        }
        return l;
    };
    d["device"] = p.device;
    d["budget"] = p.budget;
    d["gpu"] = items(p.gpu);
    d["host"] = items(p.host);
    d["gpu_total"] = p.gpu_total();
    d["context_length"] = p.context_length;
    d["cache_tokens"] = p.cache_tokens;
    d["kv_bytes_per_token"] = p.kv_bytes_per_token;
    d["max_step_tokens"] = p.max_step_tokens;
    d["offload_layers"] = p.offload_layers;
    d["offload_mode"] = p.offload_mode == OffloadMode::kCpu ? "cpu" : "stream";
    d["offload_expert_layers"] = p.offload_expert_layers;
    d["fits"] = p.fits;
    d["short_by"] = p.short_by;
    d["suggestions"] = p.suggestions;
    d["table"] = p.table();
    return d;
}

// exl3.Sequence: one sequence's KV cache in a model.
void bind_sequence(py::module_& m) {
    py::class_<PySequence, std::shared_ptr<PySequence>>(m, "Sequence",
                                                        "One sequence's state in a model: its KV cache and length.")
        .def_property_readonly("length", [](const PySequence& s) { return s.seq->length(); })
        .def_property_readonly("max_length", [](const PySequence& s) { return s.seq->max_length(); })
        .def("__len__", [](const PySequence& s) { return s.seq->length(); })
        .def(
            "reset", [](PySequence& s) { s.seq->reset(); }, "Empties the sequence (its pages go back to the cache).");
}

// exl3.Model: loading, forward passes, greedy generation, cache statistics.
void bind_model(py::module_& m) {
    m.def(
        "plan_memory",
        [](const std::string& path, const std::string& device, int context_length, int cache_tokens, int page_size,
           int kv_bits, std::optional<int> kv_bits_k, std::optional<int> kv_bits_v, std::optional<double> gpu_memory,
           int max_step_tokens, int offload_layers, const std::string& offload_mode, int offload_experts,
           bool embed_on_gpu) {
            const MemoryArgs mem{gpu_memory, max_step_tokens, offload_layers, offload_mode, offload_experts,
                                 embed_on_gpu};
            const LoadOptions o = load_options(device, 0, context_length, cache_tokens, page_size, true, kv_bits,
                                               kv_bits_k, kv_bits_v, false, mem);
            Result<MemoryPlan> r = internal_error("not run");
            {
                py::gil_scoped_release nogil;
                r = Model::plan_memory(path, o);
            }
            return memory_plan_dict(take(std::move(r)));
        },
        py::arg("path"), py::kw_only(), py::arg("device") = "cuda", py::arg("context_length") = 0,
        py::arg("cache_tokens") = 0, py::arg("page_size") = 0, py::arg("kv_bits") = 0,
        py::arg("kv_bits_k") = py::none(), py::arg("kv_bits_v") = py::none(), py::arg("gpu_memory") = py::none(),
        py::arg("max_step_tokens") = 0, py::arg("offload_layers") = 0, py::arg("offload_mode") = "stream",
        py::arg("offload_experts") = 0, py::arg("embed_on_gpu") = false,
        "The GPU memory plan Model(path, device=..., ...) would make, without loading anything onto a GPU (with "
        "gpu_memory given no GPU is needed): a dict with the items, the resolved cache and context, 'fits' and "
        "'suggestions'.");
    py::class_<PyModel, std::shared_ptr<PyModel>>(m, "Model", "A loaded model (Hugging Face safetensors or EXL3).")
        .def(py::init([](const std::string& path, const std::string& device, int threads, int context_length,
                         int cache_tokens, int page_size, bool prefix_cache, int kv_bits, std::optional<int> kv_bits_k,
                         std::optional<int> kv_bits_v, bool batch_invariant, std::optional<double> gpu_memory,
                         int max_step_tokens, int offload_layers, const std::string& offload_mode, int offload_experts,
                         bool embed_on_gpu) {
                 const MemoryArgs mem{gpu_memory, max_step_tokens, offload_layers, offload_mode, offload_experts,
                                      embed_on_gpu};
                 const LoadOptions o = load_options(device, threads, context_length, cache_tokens, page_size,
                                                    prefix_cache, kv_bits, kv_bits_k, kv_bits_v, batch_invariant, mem);
                 auto pm = std::make_shared<PyModel>();
                 Status failed;
                 {
                     py::gil_scoped_release nogil;
                     auto r = Model::load(path, o);
                     if (r.is_ok())
                         pm->model = std::move(*r);
                     else
                         failed = r.status();
                 }
                 check(failed);
                 return pm;
             }),
             py::arg("path"), py::kw_only(), py::arg("device") = "cpu", py::arg("threads") = 0,
             py::arg("context_length") = 0, py::arg("cache_tokens") = 0, py::arg("page_size") = 0,
             py::arg("prefix_cache") = true, py::arg("kv_bits") = 0, py::arg("kv_bits_k") = py::none(),
             py::arg("kv_bits_v") = py::none(), py::arg("batch_invariant") = false, py::arg("gpu_memory") = py::none(),
             py::arg("max_step_tokens") = 0, py::arg("offload_layers") = 0, py::arg("offload_mode") = "stream",
             py::arg("offload_experts") = 0, py::arg("embed_on_gpu") = false,
             "Loads a model directory. device: 'cpu', 'cuda' or 'cuda:N'; threads: CPU threads (0: EXL3_THREADS or "
             "all); context_length: 0 for the model's; cache_tokens: the paged KV cache's size in tokens (0: CUDA "
             "gives it what the memory plan leaves, the CPU grows it up to the context length); kv_bits (or "
             "kv_bits_k / kv_bits_v): 0, 4, 6 or 8 to quantize the KV cache. GPU memory (docs/memory.md): "
             "gpu_memory (GiB, None: what the device has free less 0.5 GiB), max_step_tokens, offload_layers "
             "(-1: as few as fit), offload_mode ('stream' or 'cpu'), offload_experts (-1: every MoE layer), "
             "embed_on_gpu.")
        .def_property_readonly(
            "memory_plan", [](const PyModel& pm) { return memory_plan_dict(pm.get().memory_plan()); },
            "The GPU memory plan the model was loaded with, as a dict (CUDA; 'table' is the text the load logs).")
        .def_property_readonly(
            "info", [](const PyModel& pm) { return model_info_dict(pm.get().info()); },
            "The model's shape and configuration, as a dict.")
        .def_property_readonly("device", [](const PyModel& pm) { return pm.get().device(); })
        .def_property_readonly("vocab_size", [](const PyModel& pm) { return pm.get().info().vocab_size; })
        .def_property_readonly("context_length", [](const PyModel& pm) { return pm.get().info().context_length; })
        .def(
            "new_sequence",
            [](const std::shared_ptr<PyModel>& pm, int max_length) {
                auto seq = take(pm->get().new_sequence(max_length));
                return std::make_shared<PySequence>(PySequence{pm, std::move(seq)});
            },
            py::arg("max_length") = 0, "A new empty sequence of up to max_length tokens (0: the context length).")
        .def(
            "forward",
            [](const PyModel& pm, PySequence& s, const std::vector<int64_t>& tokens, bool all_logits) {
                if (s.owner.get() != &pm) raise(invalid_argument("the sequence belongs to another model"));
                const auto ids = to_ids(tokens, "forward");
                Logits l;
                Status st;
                {
                    py::gil_scoped_release nogil;
                    st = pm.get().forward(*s.seq, ids, all_logits, &l.data);
                }
                check(st);
                l.vocab = pm.get().info().vocab_size;
                l.rows = l.vocab ? static_cast<py::ssize_t>(l.data.size()) / l.vocab : 0;
                return l;
            },
            py::arg("sequence"), py::arg("tokens"), py::arg("all_logits") = false,
            "Appends tokens to the sequence; returns the logits of every new position (all_logits) or of the last.")
        .def(
            "generate_greedy",
            [](const PyModel& pm, const std::vector<int64_t>& prompt, int max_new_tokens,
               const std::vector<int64_t>& stop_ids) {
                const auto ids = to_ids(prompt, "prompt");
                const auto stops32 = to_ids(stop_ids, "stop_ids");
                const std::vector<int> stops(stops32.begin(), stops32.end());
                Result<std::vector<int32_t>> r = internal_error("not run");
                {
                    py::gil_scoped_release nogil;
                    r = pm.get().generate_greedy(ids, max_new_tokens, stops);
                }
                return take(std::move(r));
            },
            py::arg("prompt"), py::arg("max_new_tokens"), py::arg("stop_ids") = std::vector<int64_t>{},
            "Greedy continuation of token ids (no sampler, no tokenizer): the new ids.")
        .def(
            "cache_stats", [](const PyModel& pm) { return cache_stats_dict(pm.get().cache_stats()); },
            "The paged KV cache and what prefix caching saved, as a dict.")
        .def("__repr__", [](const PyModel& pm) {
            const auto& i = pm.get().info();
            return "<exl3.Model " + i.architecture + " " + std::to_string(i.num_layers) + " layers" +
                   (i.quantization.empty() ? std::string() : ", " + i.quantization) + " on " + pm.get().device() + ">";
        });
}

// exl3.JobUpdate: what one generation step gave one job.
void bind_job_update(py::module_& m) {
    py::class_<JobUpdate>(m, "JobUpdate", "What one generation step produced for one job.")
        .def_readonly("job", &JobUpdate::job)
        .def_readonly("text", &JobUpdate::text, "New text (stop strings are held back and never emitted).")
        .def_readonly("tokens", &JobUpdate::tokens)
        .def_readonly("logprobs", &JobUpdate::logprobs)
        .def_property_readonly("top_logprobs",
                               [](const JobUpdate& u) {
                                   py::list out;
                                   for (const auto& alts : u.top_logprobs) {
                                       py::list l;
                                       for (const auto& a : alts) l.append(py::make_tuple(a.id, a.logprob));
                                       out.append(l);
                                   }
                                   return out;
                               })
        .def_property_readonly(
            "finish_reason", [](const JobUpdate& u) { return finish_name(u.finish); },
            "None while running; then 'stop', 'length', 'eos', 'cancelled' or 'error'.")
        .def_property_readonly("error",
                               [](const JobUpdate& u) -> py::object {
                                   if (u.finish != FinishReason::kError) return py::none();
                                   return py::str(u.error.to_string());
                               })
        .def_property_readonly(
            "exception",
            [](const JobUpdate& u) -> py::object {
                if (u.finish != FinishReason::kError) return py::none();
                return py::handle(error_class(u.error))(u.error.message());
            },
            "For a failed job, its error as the exl3.Error subclass to raise; else None.")
        .def_readonly("prompt_tokens", &JobUpdate::prompt_tokens)
        .def_readonly("cached_tokens", &JobUpdate::cached_tokens)
        .def_readonly("generated_tokens", &JobUpdate::generated_tokens)
        .def_readonly("draft_tokens", &JobUpdate::draft_tokens, "speculative decoding: tokens proposed so far")
        .def_readonly("accepted_tokens", &JobUpdate::accepted_tokens, "speculative decoding: proposals kept so far")
        .def_readonly("reasoning_tokens", &JobUpdate::reasoning_tokens, "tokens drawn inside reasoning so far")
        .def_readonly("output_closed", &JobUpdate::output_closed,
                      "the job ended because its JSON object, schema value or tool choice closed")
        .def("__repr__", [](const JobUpdate& u) {
            return "<exl3.JobUpdate job=" + std::to_string(u.job) + " tokens=" + std::to_string(u.tokens.size()) +
                   (u.finish == FinishReason::kNone ? std::string()
                                                    : std::string(" finish=") + finish_reason_name(u.finish)) +
                   ">";
        });
}

// exl3._Generator (wrapped by exl3.Generator in __init__.py) and the request keywords it takes.
void bind_generator(py::module_& m) {
    py::class_<PyGenerator, std::shared_ptr<PyGenerator>>(m, "_Generator")
        .def(py::init([](std::shared_ptr<PyModel> model, std::shared_ptr<PyTokenizer> tokenizer, int max_batch_tokens,
                         int prefill_chunk, int max_active_jobs, bool cap_to_context, bool device_sampling,
                         std::shared_ptr<PyModel> draft_model, int draft_tokens, int ngram_min, int ngram_max) {
                 if (!model) throw py::type_error("exl3: Generator needs a Model");
                 GeneratorOptions o;
                 o.max_batch_tokens = max_batch_tokens;
                 o.prefill_chunk = prefill_chunk;
                 o.max_active_jobs = max_active_jobs;
                 o.cap_to_context = cap_to_context;
                 o.device_sampling = device_sampling;
                 o.draft_tokens = draft_tokens;
                 o.draft_model = draft_model ? &draft_model->get() : nullptr;
                 o.ngram_min = ngram_min;
                 o.ngram_max = ngram_max;
                 auto g = std::make_shared<PyGenerator>();
                 g->model = std::move(model);
                 g->tokenizer = std::move(tokenizer);
                 g->draft = std::move(draft_model);
                 g->gen = take(Generator::create(g->model->get(), g->tokenizer ? g->tokenizer->tok : nullptr, o));
                 return g;
             }),
             py::arg("model"), py::arg("tokenizer") = py::none(), py::kw_only(), py::arg("max_batch_tokens") = 256,
             py::arg("prefill_chunk") = 128, py::arg("max_active_jobs") = 32, py::arg("cap_to_context") = true,
             py::arg("device_sampling") = true, py::arg("draft_model") = py::none(), py::arg("draft_tokens") = 0,
             py::arg("ngram_min") = 1, py::arg("ngram_max") = 3)
        .def(
            "submit",
            [](PyGenerator& g, py::handle prompt, const py::kwargs& kw) {
                return take(g.gen->submit(make_request(prompt, kw)));
            },
            py::arg("prompt"))
        .def(
            "cancel", [](PyGenerator& g, uint64_t job) { check(g.gen->cancel(job)); }, py::arg("job"))
        .def("step",
             [](PyGenerator& g) {
                 std::vector<JobUpdate> updates;
                 Status st;
                 {
                     py::gil_scoped_release nogil;
                     st = g.gen->step(&updates);
                 }
                 check(st);
                 return updates;
             })
        .def_property_readonly("has_work", [](const PyGenerator& g) { return g.gen->has_work(); })
        .def_property_readonly("live_sequences", [](const PyGenerator& g) { return g.gen->live_sequences(); });

    m.def("_request_keywords", [] {
        std::vector<std::string> names;
        for (const auto& [k, v] : request_setters()) names.push_back(k);
        return names;
    });
}

// A ReplyFormat from the dict Tokenizer.reply_format gives.
ReplyFormat reply_format_of(const py::dict& d) {
    ReplyFormat f;
    auto get = [&](const char* key, std::string* out) {
        if (d.contains(key)) *out = cast_arg<std::string>(d[key], key);
    };
    get("tools", &f.tools);
    get("reasoning", &f.reasoning);
    get("reasoning_open", &f.reasoning_open);
    get("reasoning_close", &f.reasoning_close);
    return f;
}

// The reply parsers of include/exl3/tool_calls.h and chat_reply.h, for exl3.parse_tool_calls and Generator.chat.
void bind_tool_calls(py::module_& m) {
    m.def(
        "_parse_tool_calls",
        [](py::handle text, const std::string& format) {
            const ToolCallReply r = take(parse_tool_calls(format, utf8(text, "text")));
            py::list calls;
            for (const ToolCall& c : r.calls) calls.append(py::make_tuple(c.id, c.name, c.arguments));
            return py::make_tuple(r.content, calls);
        },
        py::arg("text"), py::arg("format"), "(content, [(id, name, arguments as JSON text)])");
    m.def(
        "_reasoning_settings",
        [](const py::dict& format, py::handle prompt, int max_tokens) {
            const GenerationRequest::Reasoning r =
                reasoning_settings(reply_format_of(format), utf8(prompt, "prompt"), max_tokens);
            py::dict d;
            if (r.open.empty()) return d;
            d["open"] = r.open;
            d["close"] = r.close;
            d["closing"] = r.closing;
            d["open_anywhere"] = r.open_anywhere;
            d["starts_inside"] = r.starts_inside;
            d["max_tokens"] = r.max_tokens;
            return d;
        },
        py::arg("format"), py::arg("prompt"), py::arg("max_tokens"));
    m.def(
        "_parse_reply",
        [](const py::dict& format, py::handle text, bool starts_inside, const std::string& tools_json) {
            const auto tools = nlohmann::ordered_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
            if (tools.is_discarded()) raise(invalid_argument("tools is not JSON"));
            const ChatReply r = take(parse_reply(reply_format_of(format), utf8(text, "text"), starts_inside, tools));
            py::list calls;
            for (const ToolCall& c : r.calls) calls.append(py::make_tuple(c.id, c.name, c.arguments));
            return py::make_tuple(r.reasoning, r.content, calls);
        },
        py::arg("format"), py::arg("text"), py::arg("starts_inside"), py::arg("tools_json"),
        "(reasoning, content, [(id, name, arguments as JSON text)])");
    m.def(
        "_tool_call_markers", [](const std::string& format) { return take(tool_call_markers(format)); },
        py::arg("format"));
    m.def(
        "_check_tools",
        [](const std::string& tools_json) {
            const auto tools = nlohmann::ordered_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
            check(check_tools(tools));
        },
        py::arg("tools_json"));
}

}  // namespace
}  // namespace exl3::python

using namespace exl3;
using namespace exl3::python;

PYBIND11_MODULE(_exl3, m) {
    m.doc() = "exl3.cpp: EXL3 and Hugging Face models on the CPU or CUDA (native part; import exl3)";
    make_errors(m);
    bind_tokenizer(m);
    bind_logits(m);
    bind_sequence(m);
    bind_model(m);
    bind_job_update(m);
    bind_generator(m);
    bind_tool_calls(m);
}
