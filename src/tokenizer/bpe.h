// The BPE model: vocabulary, merge ranks, and the merge loop, with a cache of recently tokenized words.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "exl3/status.h"
#include "tokenizer/json_util.h"

namespace exl3::tok {

// String -> id with open addressing: vocabulary lookups run for every merge at load and every character at encode,
// and a node-based map spends most of that time on cache misses.
class TokenIndex {
public:
    void reserve(size_t n);
    size_t size() const { return size_; }
    // Keys are views: their storage must outlive the index. An existing key keeps its first id.
    void insert(std::string_view key, int32_t id);
    std::optional<int32_t> find(std::string_view key) const {
        if (slots_.empty()) return std::nullopt;
        uint64_t h = hash(key);
        auto tag = static_cast<uint32_t>(h >> 32);
        size_t mask = slots_.size() - 1;
        for (size_t i = static_cast<size_t>(h) & mask;; i = (i + 1) & mask) {
            const Slot& s = slots_[i];
            if (s.id < 0) return std::nullopt;
            if (s.tag == tag && s.key == key) return s.id;
        }
    }

private:
    struct Slot {
        std::string_view key;
        uint32_t tag = 0;
        int32_t id = -1;
    };
    static uint64_t hash(std::string_view s) {
        uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then a final mix so that both halves are usable
        for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
        h ^= h >> 29;
        h *= 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 32;
        return h;
    }
    std::vector<Slot> slots_;
    size_t size_ = 0;
};

class BpeModel {
public:
    // Parses tokenizer.json's "model" object (type BPE). `path` names it in errors.
    static Result<std::unique_ptr<BpeModel>> from_json(const json& j, const std::string& path);

    // Appends the ids of one pre-tokenized word. Fails only when unk_token is set but not in the vocabulary.
    Status tokenize(std::string_view word, std::vector<int32_t>& out) const;

    // The same without cutting long words at boundary characters: the reference the cut is tested against.
    Status tokenize_whole(std::string_view word, std::vector<int32_t>& out) const { return merge_word(word, out); }
    bool has_boundary() const { return !boundary_.empty(); }

    std::optional<int32_t> token_to_id(std::string_view token) const;
    // Empty view for ids the vocabulary does not have.
    std::string_view id_to_token(int32_t id) const;
    // Number of entries (HF's get_vocab_size of the model).
    size_t size() const { return vocab_.size(); }
    const std::vector<std::string>& tokens_by_id() const { return id_to_token_; }
    bool byte_fallback() const { return byte_fallback_; }
    // Id of <0xAB> for byte b, or -1.
    int32_t byte_id(uint8_t b) const { return byte_ids_[b]; }

private:
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    struct Merge {
        uint32_t rank;
        int32_t new_id;
    };
    static uint64_t pair_key(int32_t a, int32_t b) {
        return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
    }
    // Merge ranks live in an open-addressing table: the lookup is the inner loop of every merge step.
    struct MergeSlot {
        uint64_t key = kEmptyKey;
        Merge merge{};
    };
    static constexpr uint64_t kEmptyKey = ~uint64_t{0};
    static size_t slot_of(uint64_t key, size_t mask) {
        key ^= key >> 33;
        key *= 0xff51afd7ed558ccdULL;
        key ^= key >> 33;
        return static_cast<size_t>(key) & mask;
    }
    const Merge* find_merge(int32_t a, int32_t b) const {
        if (merge_slots_.empty()) return nullptr;
        uint64_t key = pair_key(a, b);
        size_t mask = merge_slots_.size() - 1;
        for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
            const MergeSlot& s = merge_slots_[i];
            if (s.key == key) return &s.merge;
            if (s.key == kEmptyKey) return nullptr;
        }
    }
    void set_merge(int32_t a, int32_t b, Merge m) {
        uint64_t key = pair_key(a, b);
        size_t mask = merge_slots_.size() - 1;
        for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
            MergeSlot& s = merge_slots_[i];
            if (s.key == key || s.key == kEmptyKey) {
                s.key = key;
                s.merge = m;
                return;
            }
        }
    }
    Status tokenize_piece(std::string_view word, std::vector<int32_t>& out) const;
    Status merge_word(std::string_view word, std::vector<int32_t>& out) const;

    std::vector<std::string> id_to_token_;  // indexed by id; holes are empty
    std::vector<bool> has_id_;
    std::deque<std::pair<std::string, int32_t>> aliases_;  // further tokens sharing an id (deque: stable storage)
    TokenIndex vocab_;                                     // views into id_to_token_ and aliases_
    std::vector<MergeSlot> merge_slots_;                   // power-of-two size, at most half full
    std::optional<std::string> unk_token_;
    std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
    bool byte_fallback_ = false;
    bool fuse_unk_ = false;
    bool ignore_merges_ = false;
    std::string_view boundary_;  // where long words may be cut (empty: nowhere); see from_json
    int32_t byte_ids_[256];      // <0xAB> ids for byte fallback, -1 when absent

    // Word -> ids. Only taken with try_lock so that concurrent encodes never wait on each other.
    mutable std::mutex cache_mutex_;
    mutable std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> cache_;
};

}  // namespace exl3::tok
