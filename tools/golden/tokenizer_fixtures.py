#!/usr/bin/env python3
"""Golden fixtures for the tokenizer module, made with HF `tokenizers` and `transformers`.

Run where both are installed (the GPU test machine):
    python3 tools/golden/tokenizer_fixtures.py --tok-root DIR --out OUTDIR
DIR holds one folder per tokenizer (llama-3.1, qwen3, llama-2, tiny-target), each with tokenizer.json,
tokenizer_config.json and generation_config.json when the model has one. Writes OUTDIR/<name>.json for each and
OUTDIR/variants.json (component variants patched over tiny-target's tokenizer.json, so that normalizers and
pre-tokenizers no shipped tokenizer uses are checked too). The texts are part of this script: the fixtures carry
them, so the C++ tests need nothing else.
"""
import argparse
import copy
import json
import os
import random
import sys
import traceback

TEXTS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space and trailing space ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you've seen it; they'll say we'd done it. DON'T SHOUT, it's FINE.",
    "Numbers: 1 12 123 1234 12345 123456 1234567 12345678901234567890 3.14159 -42 1,000,000",
    "Tabs\tand\t\ttabs\nnewlines\n\nand\r\nCRLF\r\nline\rCR",
    "    four spaces, then eight:        x",
    "trailing spaces   \n   \n\n\n   ",
    "a                                                                              b",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "中文测试：我爱北京天安门。今天天气很好！",
    "日本語のテキストです。カタカナとひらがな、そして漢字。",
    "한국어 텍스트입니다. 안녕하세요!",
    "مرحبا بالعالم، هذا نص عربي.",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "Привет, мир! Это русский текст. ЁЖИК в тумане.",
    "Γειά σου Κόσμε! ΟΔΥΣΣΕΥΣ και ΣΟΦΙΑΣ σοφός.",
    "Emoji: 😀 😃 🎉 👍🏽 ❤️ 🇫🇷 🏳️‍🌈 👨‍👩‍👧‍👦 🧑🏿‍💻",
    "Mixed: café naïve résumé Zürich façade coöperate",
    "Decomposed accents: cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030a",
    "Compatibility: ﬁ ﬂ ① ² ½ Ａｂｃ１２３ ｶﾀｶﾅ ㎏ ™ Ⅻ",
    "Hangul jamo: \u1100\u1161\u11a8 and \uac00\u11a8",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "https://example.com/path?query=1&x=y#frag user@example.org",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|>Hello<|end_of_text|>",
    "text<|begin_of_text|>text <|eot_id|> <|start_header_id|>user<|end_header_id|>\n\nhi",
    "<s>Hello</s> <s> spaced </s><unk>",
    "<think>\nreasoning\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start",
    "a<|pad|>b <|pad|> c",
    "ALL CAPS SENTENCE WITH SOME WORDS",
    "MiXeD CaSe ÀÉÎÕÜ İstanbul ß ẞ ǅ Σ",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "Punctuation!!! ??? ... --- ;;; ::: ((())) [[[]]] {{{}}} \"\"\" '''",
    "¡Hola! ¿Qué tal? «Bonjour» „Hallo“ 『日本』",
    "Zero\u200bwidth\u200cjoiner\u200dand\ufeffBOM",
    "NBSP\u00a0thin\u2009ideographic\u3000space\u2028line\u2029para\u0085nel",
    "Control \u0001\u0002\u001f chars",
    "Private \ue000 and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 𠀀",
    "x" * 300,
    "😀" * 20,
    "ab" * 80 + " " + "1" * 50,
    "The year 2024 was 366 days; 0.5% of 7 billion is 35,000,000.",
    "Mathematical: ∀x∈ℝ, x² ≥ 0 ⇒ √(x²) = |x| ∑ ∫ ∂ ∞ ≈ ≠",
    "Tab-indented\n\tcode\n\t\tblock\n",
    " \t \n \r\n ",
    "The Ελληνικά, Русский and العربية scripts mixed in one English sentence.",
    "Lowercase sigma: ΟΔΟΣ ΣΑΣ. Σ alone, ΑΣ-ΒΣ.",
]


def make_random_texts(n, seed):
    rng = random.Random(seed)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + list(" " * 10) +
            list("\n\t\r.,;:'\"!?()[]{}<>|/-_=+*&^%$#@~`") +
            list("éèàüößçñÅΣσςαβγдфжЖ中文日本語한국어ابتदेवा") + ["😀", "👍🏽", "🇫🇷", "\u0301", "\u200d", "\u3000", "ﬁ", "²"] +
            ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<s>", "</s>", "'s", "'ll", "  ", "\r\n"])
    out = []
    for _ in range(n):
        k = rng.randrange(0, 40)
        out.append("".join(rng.choice(pool) for _ in range(k)))
    return out


TOKENIZERS = ["tiny-target", "llama-3.1", "qwen3", "llama-2"]


def hf_encode(tok, text, add_special, split_special=False):
    tok.encode_special_tokens = split_special
    try:
        return tok.encode(text, add_special_tokens=add_special).ids
    finally:
        tok.encode_special_tokens = False


def make_tokenizer_fixture(name, d, texts):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    fx = {"tokenizer": name, "cases": [], "decode_cases": [], "meta": {}}
    tf = None
    try:
        from transformers import AutoTokenizer
        tf = AutoTokenizer.from_pretrained(d)
        fx["meta"]["tf_class"] = type(tf).__name__
        fx["meta"]["tf_bos_token_id"] = tf.bos_token_id
        fx["meta"]["tf_eos_token_id"] = tf.eos_token_id
        fx["meta"]["tf_vocab_size"] = len(tf)
    except Exception:
        fx["meta"]["tf_error"] = traceback.format_exc()[-2000:]
    fx["meta"]["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)
    fx["meta"]["vocab_size_base"] = tok.get_vocab_size(with_added_tokens=False)
    for text in texts:
        c = {"text": text}
        c["ids"] = hf_encode(tok, text, False)
        c["ids_special"] = hf_encode(tok, text, True)
        split = hf_encode(tok, text, False, split_special=True)
        if split != c["ids"]:
            c["ids_split_special"] = split
        c["decode"] = tok.decode(c["ids_special"], skip_special_tokens=False)
        c["decode_skip"] = tok.decode(c["ids_special"], skip_special_tokens=True)
        if tf is not None:
            try:
                t0 = tf(text, add_special_tokens=False)["input_ids"]
                t1 = tf(text, add_special_tokens=True)["input_ids"]
                if t0 != c["ids"]:
                    c["tf_ids"] = t0
                if t1 != c["ids_special"]:
                    c["tf_ids_special"] = t1
                d0 = tf.decode(t1, skip_special_tokens=False)
                d1 = tf.decode(t1, skip_special_tokens=True)
                if d0 != c["decode"]:
                    c["tf_decode"] = d0
                if d1 != c["decode_skip"]:
                    c["tf_decode_skip"] = d1
            except Exception:
                c["tf_error"] = traceback.format_exc()[-500:]
        fx["cases"].append(c)
    # Decoder alone: random ids (byte-fallback bytes that make no valid UTF-8, special tokens in the middle).
    rng = random.Random(1234)
    n = tok.get_vocab_size(with_added_tokens=True)
    low = [i for i in range(min(n, 300))]
    for k in range(30):
        ids = [rng.choice(low) if rng.random() < 0.5 else rng.randrange(n) for _ in range(rng.randrange(1, 12))]
        fx["decode_cases"].append({"ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
                                   "decode_skip": tok.decode(ids, skip_special_tokens=True)})
    return fx


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}

VARIANTS = {
    "nfkc_lower": {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}},
    "nfc": {"normalizer": {"type": "NFC"}},
    "nfd": {"normalizer": {"type": "NFD"}},
    "nfkd": {"normalizer": {"type": "NFKD"}},
    "lower": {"normalizer": {"type": "Lowercase"}},
    "strip_replace": {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
        {"type": "Replace", "pattern": {"String": "a"}, "content": "A"},
        {"type": "Prepend", "prepend": "_"}]}},
    "gpt2": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                               "use_regex": True}},
    "gpt2_noprefix": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                        "use_regex": True}},
    "digits": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BL]}},
    "digits_contig": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, BL]}},
    "punct": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Punctuation", "behavior": "Isolated"}, BL]}},
    "punct_next": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Punctuation", "behavior": "MergedWithNext"}, BL]}},
    "whitespace": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, BL]}},
    "whitespace_split": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, BL]}},
    "split_string": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(" ", "Removed", regex=False), BL]}},
    "metaspace_bl": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Metaspace", "replacement": "_", "prepend_scheme": "first", "split": True}, BL]}},
    "metaspace_always": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Metaspace", "replacement": "_", "prepend_scheme": "always", "split": True}, BL]}},
    "metaspace_never": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Metaspace", "replacement": "_", "prepend_scheme": "never", "split": False}, BL]}},
    "added_tokens": {"added": [
        {"content": "hello world", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
         "special": False},
        {"content": "<mask>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False,
         "special": True},
        {"content": "fox", "single_word": True, "lstrip": False, "rstrip": False, "normalized": False,
         "special": False},
        {"content": "[R]", "single_word": False, "lstrip": False, "rstrip": True, "normalized": False,
         "special": False},
        {"content": "[L]", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False,
         "special": False},
        {"content": "Café", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
         "special": False},
    ], "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}},
}
for beh in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
    for inv in [False, True]:
        VARIANTS[f"split_{beh}_{int(inv)}"] = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split("\\s+|[,.!]", beh, inv), BL]}}

VARIANT_TEXTS = [
    "", "Hello, world! How are you today?", "  The quick brown fox, jumps. over the lazy dog!  ",
    "Numbers: 1 12 123 1234 12345 3.14159", "Tabs\tand\nnewlines\r\n\n  x", "Mixed: café naïve résumé",
    "Decomposed: cafe\u0301 A\u030a", "Compat: ﬁ ① ² ½ Ａｂｃ１２３ ｶﾀｶﾅ ㎏ ™ Ⅻ", "ÀÉÎÕÜ İstanbul ß ẞ ǅ ΟΔΟΣ ΣΑΣ. Σ ΑΣ-ΒΣ",
    "hello world, hello  world, Hello World", "a <mask> b<mask>c   <mask>   d", "fox foxes afox fox. (fox)",
    "x [R]   y  [L]z  [L] [R]", "Café CAFÉ cafe\u0301", "中文 日本語 😀 👨‍👩‍👧", "¡Hola! ¿Qué? «x» (a) [b] {c}",
    "...,,,!!! a.b,c!d", "<|im_start|>user x<|im_end|>",
]


def make_variants(base_path, texts):
    from tokenizers import Tokenizer, AddedToken
    base = json.load(open(base_path))
    out = {"base": "tests/models/tiny-draft/tokenizer.json", "variants": []}
    for name, v in VARIANTS.items():
        entry = {"name": name, "patch": {}, "cases": []}
        try:
            j = copy.deepcopy(base)
            for key in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
                if key in v:
                    j[key] = v[key]
                    entry["patch"][key] = v[key]
            tok = Tokenizer.from_str(json.dumps(j))
            if "added" in v:
                toks = [AddedToken(a["content"], single_word=a["single_word"], lstrip=a["lstrip"],
                                   rstrip=a["rstrip"], normalized=a["normalized"], special=a["special"])
                        for a in v["added"]]
                tok.add_tokens(toks)
                entry["patch"]["added_tokens"] = json.loads(tok.to_str())["added_tokens"]
            for text in texts:
                c = {"text": text, "ids": tok.encode(text, add_special_tokens=False).ids}
                if tok.normalizer is not None:
                    c["normalized"] = tok.normalizer.normalize_str(text)
                if tok.pre_tokenizer is not None:
                    c["pieces"] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(c.get("normalized", text))]
                c["decode"] = tok.decode(c["ids"], skip_special_tokens=False)
                entry["cases"].append(c)
        except Exception:
            entry["error"] = traceback.format_exc()[-1500:]
        out["variants"].append(entry)
    return out


def char_tables():
    """Per-code-point behaviour of HF's normalizers and character classes, stored only where it is not the identity
    (normalizers) and as ranges (classes), so that the C++ tables are checked on every code point."""
    from tokenizers import normalizers, pre_tokenizers
    out = {}
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    for name, norm in (("nfc", normalizers.NFC()), ("nfkc", normalizers.NFKC()), ("nfd", normalizers.NFD()),
                       ("lower", normalizers.Lowercase())):
        m = {}
        for c in cps:
            r = norm.normalize_str(chr(c))
            if r != chr(c):
                m[c] = r
        out[name] = m

    def ranges(pred):
        rs, start = [], None
        for c in cps + [0x110000]:
            ok = c < 0x110000 and pred(c)
            if ok and start is None:
                start = c
            elif not ok and start is not None:
                rs.append([start, prev])
                start = None
            prev = c
        return rs

    ws = pre_tokenizers.Whitespace()
    classes = {}
    for c in cps:
        p = [x for x, _ in ws.pre_tokenize_str("a" + chr(c) + "a")]
        classes[c] = "w" if len(p) == 1 else ("s" if len(p) == 2 else "o")
    out["word"] = ranges(lambda c: classes[c] == "w")
    out["space"] = ranges(lambda c: classes[c] == "s")
    pu = pre_tokenizers.Punctuation()
    out["punct"] = ranges(lambda c: len(pu.pre_tokenize_str("a" + chr(c) + "a")) == 3)
    dg = pre_tokenizers.Digits(individual_digits=True)
    out["numeric"] = ranges(lambda c: len(dg.pre_tokenize_str("a" + chr(c) + "a")) == 3)
    wss = pre_tokenizers.WhitespaceSplit()
    out["whitespace"] = ranges(lambda c: len(wss.pre_tokenize_str("a" + chr(c) + "a")) == 2)
    # The Llama-3 pattern's classes: \p{L} and \p{N} as the Split pre-tokenizer sees them.
    from tokenizers import Regex
    sp = pre_tokenizers.Split(Regex("\\p{L}"), behavior="isolated")
    out["letter"] = ranges(lambda c: len(sp.pre_tokenize_str("1" + chr(c) + "1")) == 3)
    sp = pre_tokenizers.Split(Regex("\\p{N}"), behavior="isolated")
    out["number"] = ranges(lambda c: len(sp.pre_tokenize_str("a" + chr(c) + "a")) == 3)
    return out


DECODER_CASES = [
    ({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
     [["\u2581Hello", "\u2581\u2581world", "\u2581"], ["\u2581\u2581a", "b\u2581c"], ["x"], []]),
    ({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
     [["\u2581Hello", "\u2581\u2581world", "\u2581"], ["\u2581\u2581a", "b\u2581c"]]),
    ({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True},
     [["\u2581Hello", "\u2581\u2581world", "\u2581"], ["\u2581\u2581a", "b\u2581c"]]),
    ({"type": "Strip", "content": " ", "start": 1, "stop": 0}, [["  a  ", " b", "c "], ["   "], [" "]]),
    ({"type": "Strip", "content": "x", "start": 2, "stop": 2}, [["xxaxx", "xaxxx", "x", "xx", "xxx", "xxxxx"]]),
    ({"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, [["\u2581a\u2581\u2581b", "c"]]),
    ({"type": "Replace", "pattern": {"Regex": "a+"}, "content": "-"}, [["baaab", "aa", "b"]]),
    ({"type": "ByteFallback"}, [["<0x41>", "<0xC3>", "<0xA9>", "x", "<0xC3>", "y", "<0xF0>", "<0x9F>", "<0x98>"],
                                ["<0x4g>", "<0x+A>", "<0X41>", "<0x41", "<0xff>"]]),
    ({"type": "Fuse"}, [["a", "b", " c"]]),
    ({"type": "ByteLevel"}, [["Hello", "\u0120world", "<|im_start|>", "a b", "\u00c3", "\u00a9", "\u00c3"]]),
    ({"type": "BPEDecoder", "suffix": "</w>"}, [["hel", "lo</w>", "wor", "ld</w>"]]),
]


def decoder_cases():
    from tokenizers import decoders
    import tokenizers
    out = []
    for dj, token_lists in DECODER_CASES:
        for toks in token_lists:
            entry = {"decoder": dj, "tokens": toks}
            try:
                dec = tokenizers.Tokenizer.from_str(json.dumps({
                    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                    "pre_tokenizer": None, "post_processor": None, "decoder": dj,
                    "model": {"type": "BPE", "vocab": {}, "merges": []}})).decoder
                entry["output"] = dec.decode(toks)
            except BaseException:  # pyo3 turns Rust panics into PanicException, which is no Exception
                entry["error"] = traceback.format_exc()[-500:]
            out.append(entry)
    return out


def main_extra(out_dir):
    try:
        data = char_tables()
    except BaseException:
        data = {"char_tables_error": traceback.format_exc()[-1500:]}
    try:
        data["decoders"] = decoder_cases()
    except BaseException:
        data["decoders_error"] = traceback.format_exc()[-1500:]
    with open(os.path.join(out_dir, "unicode_decoders.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
    print("extra done", {k: len(v) for k, v in data.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok-root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra", action="store_true",
                    help="also write unicode_decoders.json: per-code-point normalizer and class checks, decoders")
    ap.add_argument("--only-extra", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.extra or args.only_extra:
        main_extra(args.out)
        if args.only_extra:
            return
    texts = TEXTS + make_random_texts(40, 20240601)
    versions = {"python": sys.version.split()[0]}
    try:
        import tokenizers
        versions["tokenizers"] = tokenizers.__version__
        import transformers
        versions["transformers"] = transformers.__version__
    except Exception:
        versions["error"] = traceback.format_exc()[-500:]
    print(versions)
    for name in TOKENIZERS:
        d = os.path.join(args.tok_root, name)
        try:
            fx = make_tokenizer_fixture(name, d, texts)
        except Exception:
            fx = {"tokenizer": name, "error": traceback.format_exc()[-2000:]}
        fx["versions"] = versions
        with open(os.path.join(args.out, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(fx, f, ensure_ascii=False, separators=(",", ":"))
        print(name, "done", fx.get("error", "")[:300], fx.get("meta", {}))
    try:
        var = make_variants(os.path.join(args.tok_root, "tiny-target", "tokenizer.json"), VARIANT_TEXTS)
    except Exception:
        var = {"error": traceback.format_exc()[-2000:]}
    var["versions"] = versions
    with open(os.path.join(args.out, "variants.json"), "w", encoding="utf-8") as f:
        json.dump(var, f, ensure_ascii=False, separators=(",", ":"))
    for v in var.get("variants", []):
        if "error" in v:
            print("variant", v["name"], "error", v["error"][-300:])
    print("variants done")


if __name__ == "__main__":
    main()
