// Tokenizer: HF tokenizer.json (BPE, byte-level or byte-fallback) with the model directory's tokenizer_config.json
// and generation_config.json, matching HF `tokenizers` id for id. Thread-safe: encode/decode are const.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "exl3/status.h"

namespace exl3 {

struct NamedChatTemplate {
    std::string name;  // "default" for a plain string in tokenizer_config.json
    std::string source;
};

class Tokenizer {
public:
    // `path` is a model directory (tokenizer.json, plus tokenizer_config.json and generation_config.json when
    // present) or the path of a tokenizer.json file (the configs beside it are read too).
    static Result<std::shared_ptr<const Tokenizer>> load(const std::string& path);
    // From file contents; the configs may be empty. `origin` names the source in error messages.
    static Result<std::shared_ptr<const Tokenizer>> from_json(std::string_view tokenizer_json,
                                                              std::string_view tokenizer_config_json = {},
                                                              std::string_view generation_config_json = {},
                                                              const std::string& origin = "tokenizer.json");
    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // UTF-8 text to ids. add_special_tokens: the post-processor's tokens (BOS/EOS as tokenizer_config.json asks).
    // parse_special: special tokens written in the text become their ids; when false they are encoded as text.
    // Fails on invalid UTF-8 (the message gives the byte offset).
    Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true,
                                        bool parse_special = true) const;
    // Ids to text; unknown ids are skipped, as HF does. Invalid byte sequences become U+FFFD.
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

    std::optional<int32_t> token_to_id(std::string_view token) const;
    std::optional<std::string> id_to_token(int32_t id) const;
    // Distinct tokens, added tokens included (HF's get_vocab_size(with_added_tokens=True)).
    size_t vocab_size() const;
    // Largest id any token has, plus one: the size an embedding table must at least have.
    size_t id_space() const;
    bool is_special(int32_t id) const;

    // -1 when the model has none.
    int32_t bos_id() const;
    int32_t eos_id() const;
    // Every id that ends generation: generation_config.json's eos_token_id (int or list) and eos_id().
    const std::vector<int32_t>& eos_ids() const;
    const std::string& bos_token() const;  // "" when none
    const std::string& eos_token() const;

    // The chat template of that name ("default" for the main one), or nullptr when there is none.
    const std::string* chat_template(std::string_view name = "default") const;
    const std::vector<NamedChatTemplate>& chat_templates() const;

    // Internals (src/tokenizer/tokenizer_impl.h), for the streaming detokenizer and the stage-by-stage tests.
    struct Impl;
    const Impl& impl() const { return *impl_; }

private:
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    static Result<std::unique_ptr<Impl>> build_impl(std::string_view tokenizer_json,
                                                    std::string_view tokenizer_config_json,
                                                    std::string_view generation_config_json, const std::string& origin);
    std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: feed ids one at a time and get the text they add. A delta never ends inside a UTF-8
// sequence (bytes of an incomplete character are held back), and the deltas plus flush() concatenate to exactly
// decode(all ids). Cost per step is bounded: only the last few tokens are decoded again. (After 128 held tokens,
// e.g. a model stuck emitting invalid bytes, the text is emitted as it stands.)
class IncrementalDetokenizer {
public:
    explicit IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens = false);
    // The new text (possibly empty).
    std::string step(int32_t id);
    // Whatever is still held back (an incomplete UTF-8 tail decodes to U+FFFD, as decode does).
    std::string flush();
    void reset();

private:
    std::shared_ptr<const Tokenizer> tok_;
    bool skip_special_;
    // The window: window_[0, read_) produced the last delta and is kept as context (a decoder may treat the first
    // token specially, e.g. strip its leading space); window_[read_, end) has not been emitted yet.
    std::vector<int32_t> window_;
    size_t read_ = 0;
};

}  // namespace exl3
