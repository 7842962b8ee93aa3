// The stages of a tokenizer.json pipeline: normalizers, pre-tokenizers, decoders and post-processors, each parsed
// from its JSON object. Stages work on whole strings (pieces, tokens); none tracks offsets, since only ids are
// produced.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "exl3/status.h"
#include "tokenizer/json_util.h"

namespace exl3::tok {

class Normalizer {
public:
    virtual ~Normalizer() = default;
    virtual void normalize(std::string& s) const = 0;
};

// A piece of the input on its way to the model.
struct Piece {
    std::string text;
    // Whether the piece starts at offset 0 of the original input: Metaspace's prepend_scheme "first" needs it.
    bool at_origin = false;
};

class PreTokenizer {
public:
    virtual ~PreTokenizer() = default;
    // Replaces every piece by the pieces it splits into (empty ones dropped).
    virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
public:
    virtual ~Decoder() = default;
    // HF's decode_chain: tokens in, tokens out; the final text is their concatenation.
    virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// The special tokens a post-processor adds around one sequence.
class PostProcessor {
public:
    virtual ~PostProcessor() = default;
    virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

// Each parser takes the component's JSON and its path in the file ("normalizer", "pre_tokenizer.pretokenizers[1]")
// for error messages. A null JSON value gives a null component.
Result<std::unique_ptr<Normalizer>> parse_normalizer(const json& j, const std::string& path);
Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const json& j, const std::string& path);
Result<std::unique_ptr<Decoder>> parse_decoder(const json& j, const std::string& path);
Result<std::unique_ptr<PostProcessor>> parse_post_processor(const json& j, const std::string& path);

// [bos] $A [eos]: what transformers builds from tokenizer_config.json's add_bos_token/add_eos_token.
std::unique_ptr<PostProcessor> make_bos_eos_processor(int32_t bos_id, int32_t eos_id);

}  // namespace exl3::tok
