#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_tables.inc: the Unicode data the tokenizer needs without ICU.

    python3 tools/gen_unicode_tables.py tests/fixtures/tokenizer/unicode_decoders.json \\
        > src/tokenizer/unicode_tables.inc

The base data comes from Python's `unicodedata` and from str.lower of single characters (the full Unicode
lowercase mapping, as Rust's char::to_lowercase gives it): canonical combining classes, full canonical and
compatibility decompositions, primary composites, per-character lowercase mappings (HF's Lowercase maps each
character alone, with no final-sigma rule), and the general-category sets used by pre-tokenizers (numeric,
punctuation). Hangul syllables are algorithmic and left out.

Why a second input. HF `tokenizers` does not use one Unicode version: its normalizers come from the
unicode-normalization-alignments crate, whose tables are OLDER than Unicode 12 (U+1F16C, U+32FF, U+A7F2,
U+11938, ... are left alone), its Lowercase is Rust's char::to_lowercase, which is NEWER (Unicode 16: U+1C89,
U+A7CB, ...), its punctuation test is the old unicode_categories crate (e.g. U+166D is still Po there and the
Unicode 10+ Po characters are not), its numeric test is Rust's char::is_numeric (Unicode 16), and its regex
classes are Oniguruma's (Unicode 16). Python's unicodedata is one version (14.0 here), so the tables are
corrected per code point from the fixture tests/fixtures/tokenizer/unicode_decoders.json (HF's own output for
every code point, made by tools/golden; see the test TokenizerGolden.PerCodePointAndDecoders):

  * decompositions HF does not apply (its NFD or NFKC leaves the character unchanged while Python's does not)
    are dropped from the canonical/compatibility tables, and a dropped canonical decomposition is also dropped
    from the composition pairs, so NFC/NFD/NFKC/NFKD of any sequence agree with HF, not just of one character;
    any other kind of normalization difference stops the generator, since it would need a new kind of override;
  * lowercase mappings are HF's (added or changed where the fixture says so);
  * the punctuation and numeric sets are HF's;
  * regex \\p{L}, \\p{N} and \\w run on PCRE2 (Debian 10.42: Unicode 14, the same as Python here); the code
    points HF's Oniguruma has in those classes beyond it are emitted as kRegexExtra* (ranges that were
    unassigned in Unicode 14). A class where PCRE2 has more than HF stops the generator.

Overrides are printed as counts in the output's header. Regenerate after a new fixture or a new Python with the
command above; with another Python's Unicode version the override sets change but the result must not.
"""
import json
import sys
import unicodedata as ud

MAX = 0x110000
SURR = range(0xD800, 0xE000)
CHARS = [c for c in range(MAX) if c not in SURR]


def is_hangul_syllable(c):
    return 0xAC00 <= c < 0xAC00 + 11172


def ranges(pred):
    out, start = [], None
    for c in range(MAX + 1):
        ok = c < MAX and c not in SURR and pred(c)
        if ok and start is None:
            start = c
        elif not ok and start is not None:
            out.append((start, c - 1))
            start = None
    return out


def emit_ranges(name, rs, w):
    w(f"// {len(rs)} ranges\nstatic constexpr CodeRange {name}[] = {{\n")
    for i in range(0, len(rs), 6):
        w("    " + " ".join(f"{{0x{a:X}, 0x{b:X}}}," for a, b in rs[i:i + 6]) + "\n")
    w("};\n\n")


def die(msg):
    sys.exit(f"gen_unicode_tables: {msg}")


def load_fixture(path):
    fx = json.load(open(path, encoding="utf-8"))
    maps = {k: {int(c): v for c, v in fx[k].items()} for k in ("nfc", "nfkc", "nfd", "lower")}
    sets = {}
    for k in ("punct", "numeric", "letter", "number", "word"):
        s = set()
        for a, b in fx[k]:
            s.update(range(a, b + 1))
        sets[k] = s
    return maps, sets


def hf_of(maps, key, c):
    return maps[key].get(c, chr(c))


def main():
    if len(sys.argv) != 2:
        die("usage: gen_unicode_tables.py tests/fixtures/tokenizer/unicode_decoders.json > unicode_tables.inc")
    maps, sets = load_fixture(sys.argv[1])

    # Decompositions HF does not apply.
    no_canon, no_compat = set(), set()
    for c in CHARS:
        s = chr(c)
        if ud.normalize("NFD", s) != hf_of(maps, "nfd", c):
            if hf_of(maps, "nfd", c) != s:
                die(f"HF's NFD of U+{c:04X} is neither Python's nor the character itself")
            no_canon.add(c)
        if ud.normalize("NFKC", s) != hf_of(maps, "nfkc", c):
            if hf_of(maps, "nfkc", c) != s:
                die(f"HF's NFKC of U+{c:04X} is neither Python's nor the character itself")
            no_compat.add(c)
    no_compat |= no_canon  # NFKD applies the canonical decompositions too
    # The tables hold fully expanded decompositions; an override must not hide inside another one's expansion.
    for c in CHARS:
        dec = ud.decomposition(chr(c))
        raw = [int(x, 16) for x in dec.split() if not x.startswith("<")]
        if any(x in no_compat for x in raw):
            die(f"U+{c:04X} decomposes through a character whose decomposition HF drops")

    out = []
    w = out.append
    w("// Generated by tools/gen_unicode_tables.py from Python's unicodedata "
      f"(Unicode {ud.unidata_version}) with HF's per-code-point\n"
      "// overrides from tests/fixtures/tokenizer/unicode_decoders.json (see the generator). Do not edit.\n")
    notes = []
    w("// clang-format off\n\n")

    # Canonical combining classes: runs of equal nonzero class.
    runs, cur = [], None
    for c in CHARS:
        k = ud.combining(chr(c))
        if k and cur and cur[1] == c - 1 and cur[2] == k:
            cur[1] = c
        elif k:
            cur = [c, c, k]
            runs.append(cur)
        else:
            cur = None
    w(f"// {len(runs)} runs\nstatic constexpr CccRange kCcc[] = {{\n")
    for i in range(0, len(runs), 5):
        w("    " + " ".join(f"{{0x{a:X}, 0x{b:X}, {k}}}," for a, b, k in runs[i:i + 5]) + "\n")
    w("};\n\n")

    # Full decompositions (already recursively applied and canonically ordered by unicodedata).
    pool, canon, compat = [], [], []
    for c in CHARS:
        if is_hangul_syllable(c):
            continue
        s = chr(c)
        d = s if c in no_canon else ud.normalize("NFD", s)
        if d != s:
            canon.append((c, len(pool), len(d)))
            pool.extend(ord(x) for x in d)
        k = d if c in no_compat else ud.normalize("NFKD", s)
        if k != d:
            compat.append((c, len(pool), len(k)))
            pool.extend(ord(x) for x in k)
    w("// HF leaves these decompositions out (its normalization data predates them): canonical "
      + (" ".join(f"U+{c:04X}" for c in sorted(no_canon)) or "none") + ";\n// compatibility-only: "
      + f"{len(no_compat - no_canon)} code points.\n")
    w("static constexpr uint32_t kDecompPool[] = {\n")
    for i in range(0, len(pool), 10):
        w("    " + " ".join(f"0x{x:X}," for x in pool[i:i + 10]) + "\n")
    w("};\n\n")
    for name, tab in (("kCanonDecomp", canon), ("kCompatDecomp", compat)):
        w(f"// {len(tab)} entries: code point, offset in kDecompPool, length\n")
        w(f"static constexpr Decomp {name}[] = {{\n")
        for i in range(0, len(tab), 5):
            w("    " + " ".join(f"{{0x{a:X}, {o}, {n}}}," for a, o, n in tab[i:i + 5]) + "\n")
        w("};\n\n")

    # Primary composites: a two-character canonical decomposition that NFC recomposes (none whose decomposition
    # HF drops: HF's NFC cannot produce a character its NFD does not take apart).
    comps = []
    for c in CHARS:
        if is_hangul_syllable(c) or c in no_canon:
            continue
        dec = ud.decomposition(chr(c))
        if not dec or dec.startswith("<"):
            continue
        parts = [int(x, 16) for x in dec.split()]
        if len(parts) == 2 and ud.normalize("NFC", chr(c)) == chr(c):
            comps.append((parts[0], parts[1], c))
    comps.sort()
    w(f"// {len(comps)} pairs, sorted: first, second, composite\nstatic constexpr Compose kCompose[] = {{\n")
    for i in range(0, len(comps), 4):
        w("    " + " ".join(f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in comps[i:i + 4]) + "\n")
    w("};\n\n")

    # Lowercase: the full mapping (may be several characters, e.g. U+0130), HF's where it differs from Python's.
    lpool, lower, changed = [], [], []
    for c in CHARS:
        l = hf_of(maps, "lower", c)
        if l != chr(c).lower():
            changed.append(c)
        if l != chr(c):
            lower.append((c, len(lpool), len(l)))
            lpool.extend(ord(x) for x in l)
    w(f"// Lowercase mappings HF has and Python's Unicode {ud.unidata_version} lacks or maps differently: "
      f"{len(changed)} code points.\n")
    w("static constexpr uint32_t kLowerPool[] = {\n")
    for i in range(0, len(lpool), 10):
        w("    " + " ".join(f"0x{x:X}," for x in lpool[i:i + 10]) + "\n")
    w("};\n\n")
    w(f"// {len(lower)} entries\nstatic constexpr Decomp kLower[] = {{\n")
    for i in range(0, len(lower), 5):
        w("    " + " ".join(f"{{0x{a:X}, {o}, {n}}}," for a, o, n in lower[i:i + 5]) + "\n")
    w("};\n\n")

    cat = lambda c: ud.category(chr(c))
    ascii_punct = set(range(0x21, 0x30)) | set(range(0x3A, 0x41)) | set(range(0x5B, 0x61)) | set(range(0x7B, 0x7F))
    py_sets = {
        "numeric": {c for c in CHARS if cat(c) in ("Nd", "Nl", "No")},
        "punct": {c for c in CHARS if cat(c).startswith("P") or c in ascii_punct},
    }
    for key, name in (("numeric", "kNumeric"), ("punct", "kPunctuation")):
        hf, py = sets[key], py_sets[key]
        w(f"// HF's set: Python's Unicode {ud.unidata_version} general categories plus {len(hf - py)} and minus "
          f"{len(py - hf)} code points.\n")
        emit_ranges(name, ranges(lambda c: c in hf), w)

    # Regex classes: what Oniguruma (HF) has beyond PCRE2 (modelled by Python's categories, same Unicode version).
    circled = set(range(0x24B6, 0x24EA)) | set(range(0x1F130, 0x1F14A)) | set(range(0x1F150, 0x1F16A)) | \
        set(range(0x1F170, 0x1F18A))
    pcre = {
        "letter": lambda c: cat(c).startswith("L"),
        "number": lambda c: cat(c).startswith("N"),
        # regex.cpp's \w: \p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}, ZWNJ, ZWJ and the circled/squared letters.
        "word": lambda c: cat(c)[0] in "LM" or cat(c) in ("Nd", "Nl", "Pc") or c in (0x200C, 0x200D) or c in circled,
    }
    for key, name in (("letter", "kRegexExtraLetter"), ("number", "kRegexExtraNumber"), ("word", "kRegexExtraWord")):
        py = {c for c in CHARS if pcre[key](c)}
        if py - sets[key]:
            die(f"PCRE2's {key} class has code points HF's lacks: "
                + " ".join(f"U+{c:04X}" for c in sorted(py - sets[key])[:20]))
        extra = sets[key] - py
        w(f"// Oniguruma's {key} class beyond PCRE2's (Unicode {ud.unidata_version}): {len(extra)} code points.\n")
        emit_ranges(name, ranges(lambda c: c in extra), w)
    sys.stdout.write("".join(out))


if __name__ == "__main__":
    main()
