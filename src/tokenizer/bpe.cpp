#include "tokenizer/bpe.h"

#include <fmt/core.h>

#include <algorithm>
#include <queue>

#include "tokenizer/unicode.h"

namespace exl3::tok {

namespace {
constexpr size_t kCacheCapacity = 1 << 17;
constexpr size_t kMaxCachedWord = 256;  // bytes; longer words are rare and would crowd the cache
}  // namespace

void TokenIndex::reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    size_ = 0;
    for (auto& s : old)
        if (s.id >= 0) insert(s.key, s.id);
}

void TokenIndex::insert(std::string_view key, int32_t id) {
    if ((size_ + 1) * 2 > slots_.size()) reserve(std::max<size_t>(size_ + 1, slots_.size()));
    uint64_t h = hash(key);
    auto tag = static_cast<uint32_t>(h >> 32);
    size_t mask = slots_.size() - 1;
    for (size_t i = static_cast<size_t>(h) & mask;; i = (i + 1) & mask) {
        Slot& s = slots_[i];
        if (s.id >= 0 && s.tag == tag && s.key == key) return;
        if (s.id < 0) {
            s = Slot{key, tag, id};
            ++size_;
            return;
        }
    }
}

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const json& j, const std::string& path) {
    if (!j.is_object()) return invalid_argument(fmt::format("{} must be an object, found {}", path, j.type_name()));
    std::string type;
    EXL3_RETURN_IF_ERROR(json_string(j, "type", path, &type, false));
    // Old files leave the type out and let the fields tell; only BPE has merges.
    if (type.empty() && json_member(j, "merges")) type = "BPE";
    if (type.empty())
        return unsupported(fmt::format("{} has no \"type\" and no \"merges\": only BPE models are supported", path));
    if (type != "BPE")
        return unsupported(fmt::format("{}.type \"{}\" is not supported (only BPE models are)", path, type));
    auto m = std::unique_ptr<BpeModel>(new BpeModel());
    if (const json* d = json_member(j, "dropout")) {
        if (!d->is_number()) return invalid_argument(fmt::format("{}.dropout must be a number or null", path));
        double p = d->get<double>();
        if (p > 0.0) return unsupported(fmt::format("{}.dropout = {} is not supported (inference uses none)", path, p));
    }
    std::string unk;
    EXL3_RETURN_IF_ERROR(json_string(j, "unk_token", path, &unk, false));
    if (json_member(j, "unk_token")) m->unk_token_ = unk;
    EXL3_RETURN_IF_ERROR(json_string(j, "continuing_subword_prefix", path, &m->prefix_, false));
    EXL3_RETURN_IF_ERROR(json_string(j, "end_of_word_suffix", path, &m->suffix_, false));
    EXL3_RETURN_IF_ERROR(json_bool(j, "byte_fallback", path, &m->byte_fallback_));
    EXL3_RETURN_IF_ERROR(json_bool(j, "fuse_unk", path, &m->fuse_unk_));
    EXL3_RETURN_IF_ERROR(json_bool(j, "ignore_merges", path, &m->ignore_merges_));

    const json* vocab = json_member(j, "vocab");
    if (!vocab || !vocab->is_object())
        return invalid_argument(fmt::format("{}.vocab must be an object {{token: id}}", path));
    int64_t max_id = -1;
    for (auto it = vocab->begin(); it != vocab->end(); ++it) {
        if (!it.value().is_number_integer())
            return invalid_argument(fmt::format("{}.vocab[\"{}\"] must be an integer id", path, it.key()));
        int64_t id = it.value().get<int64_t>();
        if (id < 0 || id >= (int64_t{1} << 31) - 1)
            return invalid_argument(fmt::format("{}.vocab[\"{}\"] = {} is out of range", path, it.key(), id));
        max_id = std::max(max_id, id);
    }
    if (max_id >= 0 && static_cast<size_t>(max_id) > vocab->size() * 4 + (1 << 20))
        return invalid_argument(
            fmt::format("{}.vocab: id {} is far beyond the {} entries", path, max_id, vocab->size()));
    m->id_to_token_.resize(static_cast<size_t>(max_id + 1));
    m->has_id_.assign(static_cast<size_t>(max_id + 1), false);
    for (auto it = vocab->begin(); it != vocab->end(); ++it) {
        auto id = static_cast<int32_t>(it.value().get<int64_t>());
        if (utf8_find_invalid(it.key()) != std::string::npos)
            return invalid_argument(fmt::format("{}.vocab has a token that is not valid UTF-8 (id {})", path, id));
        if (m->has_id_[id]) {  // two tokens with one id: both encode to it, the first decodes from it
            m->aliases_.emplace_back(it.key(), id);
            continue;
        }
        m->id_to_token_[id] = it.key();
        m->has_id_[id] = true;
    }
    // The views point into id_to_token_, which no longer changes.
    m->vocab_.reserve(vocab->size());
    for (size_t id = 0; id < m->id_to_token_.size(); ++id)
        if (m->has_id_[id]) m->vocab_.insert(m->id_to_token_[id], static_cast<int32_t>(id));
    for (auto& [token, id] : m->aliases_) m->vocab_.insert(token, id);
    for (int b = 0; b < 256; ++b) {
        auto id = m->token_to_id(fmt::format("<0x{:02X}>", b));
        m->byte_ids_[b] = id ? *id : -1;
    }
    // A word boundary for long words (SentencePiece-style models see the whole text as one word): a character that
    // is a token by itself and that no token holds after a different character. Prefix/suffix and ignore_merges
    // depend on the whole word, so they rule it out.
    if (m->prefix_.empty() && m->suffix_.empty() && !m->ignore_merges_) {
        for (const char* c : {"\xE2\x96\x81", " "}) {
            std::string_view b = c;
            if (!m->token_to_id(b)) continue;
            bool ok = true;
            for (size_t id = 0; id < m->id_to_token_.size() && ok; ++id) {
                std::string_view t = m->id_to_token_[id];
                for (size_t pos = t.find(b, 1); pos != std::string_view::npos && ok; pos = t.find(b, pos + 1)) {
                    // Allowed only inside a leading run of boundary characters.
                    for (size_t k = 0; k < pos && ok; k += b.size()) ok = t.substr(k, b.size()) == b;
                }
            }
            for (auto& [t, id] : m->aliases_)
                if (t.find(b, 1) != std::string::npos) ok = false;
            if (ok) {
                m->boundary_ = b;
                break;
            }
        }
    }

    const json* merges = json_member(j, "merges");
    if (merges && !merges->is_array()) return invalid_argument(fmt::format("{}.merges must be an array", path));
    if (merges) {
        size_t cap = 16;
        while (cap < merges->size() * 2) cap *= 2;
        m->merge_slots_.assign(cap, MergeSlot{});
        std::string_view a, b;
        std::string merged;
        for (size_t r = 0; r < merges->size(); ++r) {
            const json& e = (*merges)[r];
            if (e.is_string()) {
                const std::string& s = e.get_ref<const std::string&>();
                size_t sp = s.find(' ');
                if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                    return invalid_argument(
                        fmt::format("{}.merges[{}] = \"{}\" must be two tokens separated by one space", path, r, s));
                a = std::string_view(s).substr(0, sp);
                b = std::string_view(s).substr(sp + 1);
            } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
                a = e[0].get_ref<const std::string&>();
                b = e[1].get_ref<const std::string&>();
            } else {
                return invalid_argument(fmt::format("{}.merges[{}] must be \"a b\" or [\"a\", \"b\"]", path, r));
            }
            auto ia = m->token_to_id(a), ib = m->token_to_id(b);
            if (!ia || !ib)
                return invalid_argument(
                    fmt::format("{}.merges[{}]: token \"{}\" is not in the vocabulary", path, r, !ia ? a : b));
            std::string_view tail = b;
            if (!m->prefix_.empty() && tail.substr(0, m->prefix_.size()) == m->prefix_)
                tail.remove_prefix(m->prefix_.size());
            merged.assign(a);
            merged.append(tail);
            auto in = m->token_to_id(merged);
            if (!in)
                return invalid_argument(
                    fmt::format("{}.merges[{}]: merged token \"{}\" is not in the vocabulary", path, r, merged));
            // A repeated pair keeps its last rank, as a map built in file order would.
            m->set_merge(*ia, *ib, Merge{static_cast<uint32_t>(r), *in});
        }
    }
    return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
    return vocab_.find(token);
}

std::string_view BpeModel::id_to_token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return {};
    return id_to_token_[id];
}

Status BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return Status::ok();
    if (ignore_merges_) {
        if (auto id = vocab_.find(word)) {
            out.push_back(*id);
            return Status::ok();
        }
    }
    if (!boundary_.empty() && word.size() > kMaxCachedWord / 4) {
        // Cut before each boundary character that follows another character: no token spans such a cut (checked
        // at load), so the pieces merge exactly as the whole would, and each piece can come from the cache.
        size_t start = 0;
        for (size_t pos = word.find(boundary_, 1); pos != std::string_view::npos; pos = word.find(boundary_, pos + 1)) {
            if (pos >= boundary_.size() && word.substr(pos - boundary_.size(), boundary_.size()) == boundary_)
                continue;  // inside a run of boundary characters
            if (pos > start) EXL3_RETURN_IF_ERROR(tokenize_piece(word.substr(start, pos - start), out));
            start = pos;
        }
        return tokenize_piece(word.substr(start), out);
    }
    return tokenize_piece(word, out);
}

Status BpeModel::tokenize_piece(std::string_view word, std::vector<int32_t>& out) const {
    bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
        std::unique_lock lock(cache_mutex_, std::try_to_lock);
        if (lock.owns_lock()) {
            auto it = cache_.find(word);
            if (it != cache_.end()) {
                out.insert(out.end(), it->second.begin(), it->second.end());
                return Status::ok();
            }
        }
    }
    size_t first = out.size();
    EXL3_RETURN_IF_ERROR(merge_word(word, out));
    if (cacheable) {
        std::unique_lock lock(cache_mutex_, std::try_to_lock);
        if (lock.owns_lock()) {
            if (cache_.size() >= kCacheCapacity) cache_.clear();
            cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
        }
    }
    return Status::ok();
}

Status BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
    struct Sym {
        int32_t id;
        int32_t prev, next;
        bool alive;
    };
    thread_local std::vector<Sym> syms;
    syms.clear();
    auto add = [&](int32_t id) {
        int32_t n = static_cast<int32_t>(syms.size());
        syms.push_back(Sym{id, n - 1, -1, true});
        if (n > 0) syms[n - 1].next = n;
    };

    // Initial symbols: one per character (with prefix/suffix), else its bytes, else unk.
    std::optional<int32_t> unk_id;
    if (unk_token_) {
        unk_id = token_to_id(*unk_token_);
        if (!unk_id)
            return invalid_argument(fmt::format("model.unk_token \"{}\" is not in the vocabulary", *unk_token_));
    }
    bool pending_unk = false;
    std::string buf;
    for (size_t i = 0; i < word.size();) {
        size_t at = i;
        i += utf8_len(static_cast<uint8_t>(word[i]));
        if (i > word.size()) i = word.size();
        std::string_view ch = word.substr(at, i - at);
        std::string_view key = ch;
        if ((!prefix_.empty() && at > 0) || (!suffix_.empty() && i == word.size())) {
            buf.clear();
            if (at > 0) buf += prefix_;
            buf += ch;
            if (i == word.size()) buf += suffix_;
            key = buf;
        }
        if (auto id = vocab_.find(key)) {
            if (pending_unk) {
                add(*unk_id);
                pending_unk = false;
            }
            add(*id);
            continue;
        }
        if (byte_fallback_) {
            bool all =
                std::all_of(key.begin(), key.end(), [&](char b) { return byte_ids_[static_cast<uint8_t>(b)] >= 0; });
            if (all) {
                // As in HF, a pending unk is not flushed here: it lands after these bytes.
                for (char b : key) add(byte_ids_[static_cast<uint8_t>(b)]);
                continue;
            }
        }
        if (unk_id) {
            if (pending_unk && !fuse_unk_) add(*unk_id);
            pending_unk = true;
        }
    }
    if (pending_unk) add(*unk_id);

    size_t n = syms.size();
    if (n > 1) {
        if (n <= 48) {
            // Short words: find the lowest-ranked adjacent pair (leftmost on ties) by scanning; same order as the heap.
            while (true) {
                const Merge* best = nullptr;
                int32_t best_pos = -1;
                for (int32_t p = 0; p != -1 && syms[p].next != -1; p = syms[p].next) {
                    const Merge* m = find_merge(syms[p].id, syms[syms[p].next].id);
                    if (m && (!best || m->rank < best->rank)) {
                        best = m;
                        best_pos = p;
                    }
                }
                if (!best) break;
                int32_t nx = syms[best_pos].next;
                syms[best_pos].id = best->new_id;
                syms[best_pos].next = syms[nx].next;
                if (syms[nx].next != -1) syms[syms[nx].next].prev = best_pos;
                syms[nx].alive = false;
            }
        } else {
            struct Cand {
                uint32_t rank;
                int32_t pos;
                int32_t new_id;
                bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
            };
            std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
            for (size_t p = 0; p + 1 < n; ++p) {
                if (const Merge* m = find_merge(syms[p].id, syms[p + 1].id))
                    heap.push(Cand{m->rank, static_cast<int32_t>(p), m->new_id});
            }
            while (!heap.empty()) {
                Cand c = heap.top();
                heap.pop();
                Sym& s = syms[c.pos];
                if (!s.alive || s.next == -1) continue;
                const Merge* m = find_merge(s.id, syms[s.next].id);
                if (!m || m->new_id != c.new_id) continue;  // stale: a neighbour changed since it was queued
                int32_t nx = s.next;
                s.id = c.new_id;
                s.next = syms[nx].next;
                if (s.next != -1) syms[s.next].prev = c.pos;
                syms[nx].alive = false;
                if (s.prev != -1) {
                    if (const Merge* pm = find_merge(syms[s.prev].id, s.id))
                        heap.push(Cand{pm->rank, s.prev, pm->new_id});
                }
                if (s.next != -1) {
                    if (const Merge* nm = find_merge(s.id, syms[s.next].id))
                        heap.push(Cand{nm->rank, c.pos, nm->new_id});
                }
            }
        }
    }
    for (int32_t p = n ? 0 : -1; p != -1; p = syms[p].next) out.push_back(syms[p].id);
    return Status::ok();
}

}  // namespace exl3::tok
