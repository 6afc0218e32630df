#!/usr/bin/env python3
"""Golden for the GGUF tokenizer's `gpt-4o` pre-tokenizer (o200k, gpt-oss's o200k_harmony).

The real o200k vocabulary is not on this machine, so this builds a small byte-level BPE
vocabulary and checks what does not depend on the vocabulary's size: where the text is cut into
pre-tokens, and the ids BPE then gives inside each pre-token.

  pieces  the pre-token split, from the o200k regex run by the Python `regex` module (a different
          regex engine from the Oniguruma one inside `tokenizers`). The pattern is tiktoken's
          `o200k_base` pat_str (tiktoken/tiktoken_ext/openai_public.py, also used by
          o200k_harmony), the one llama.cpp quotes as the "original regex from tokenizer.json"
          for LLAMA_VOCAB_PRE_TYPE_GPT4O (src/llama-vocab.cpp).
  ids     rank-ordered BPE on each piece's GPT-2 byte-to-unicode text, in plain Python below
          (no `ignore_merges`: llama.cpp's GPT4O type leaves it off). The script asserts that
          Hugging Face `tokenizers` with o200k's tokenizer.json pre-tokenizer (Split Isolated, then
          ByteLevel without regex, no normaliser) gives the same pieces and ids.

The merges are trained on the whole test strings with no pre-tokenizer, so many of them cross a
pre-token boundary: a wrong boundary in the Rust tokenizer changes the ids, not only the pieces.
One extra token (" qqq" as "Ġqqq") is in the vocabulary but no merge builds it: with
`ignore_merges` on it would be one id, without it is three.

Run (CPU, seconds; deterministic):
  /root/.pyenv/versions/3.12.1/bin/python3.12 tools/golden/make_gpt4o_tokenizer_golden.py \
      --out tests/fixtures/tokenizer/gpt4o_pretokenizer.json
Used by crates/engine/tests/tokenizer_gpt4o.rs.
"""

import argparse
import json

import regex
import tokenizers
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

O200K = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

SPECIALS = ["<|endoftext|>", "<|return|>"]
UNREACHABLE = "Ġqqq"

STRINGS = [
    # contractions, lower and upper case, inside and after words
    "Don't you LOVE it? I'M sure they'RE here, we'VE got it, he'LL go, she'D say, it'S fine",
    "HELLO's World'S don'T can't WON'T y'all rock'n'roll 's 'S 'll",
    "camelCaseWord XMLHttpRequest iPhone McDonald's ABCdef aBC",
    # digit runs of 1..7, alone and inside words
    "1 12 123 1234 12345 123456 1234567",
    "x1234567y 3.14159 1,000,000 v2 ½ Ⅻ ²³",
    # CJK, Hangul
    "日本語のテキスト、中文字符。한국어 문장",
    # accents: combining marks and precomposed, scripts with vowel signs
    "e\u0301cole na\u0308ive Cafe\u0301 école naïve",
    "తెలుగు नमस्ते Ünïcödé ΑΒΓ αβγ Привет МИР",
    # newlines, carriage returns, tabs and space runs
    "a\n\nb\r\n  c   \n\n   d\t\te  ",
    "   leading",
    "trailing   ",
    "\n\n\n",
    " \n \n",
    "x \n\n y",
    # punctuation followed by newlines or slashes
    "end.\n\nnext",
    "path/to/file.txt",
    "http://example.com/a//b?q=1&r=2",
    "foo!!!\n/bar ,/\n",
    'fn main() {\n    println!("{}", x);\n}\n',
    # emoji: with variation selector, ZWJ family, flags
    "I ❤️ 🍕 👨‍👩‍👧‍👦 🇫🇷!",
    # special tokens in the text, and the unreachable token
    "hi<|return|>there<|endoftext|>",
    " qqq qqq",
]


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHAR = bytes_to_unicode()


def byte_level(text):
    return "".join(BYTE_CHAR[b] for b in text.encode("utf-8"))


def bpe(word, ranks):
    """Rank-ordered BPE: merge the lowest-ranked adjacent pair until none is in the merges."""
    parts = list(word)
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get((parts[i], parts[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def split_specials(text):
    """The text cut at special tokens: [(segment, is_special)]."""
    out = []
    pattern = "(" + "|".join(regex.escape(s) for s in SPECIALS) + ")"
    for seg in regex.split(pattern, text):
        if seg:
            out.append((seg, seg in SPECIALS))
    return out


def o200k_pre_tokenizer():
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(O200K), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--merges", type=int, default=400, help="number of merges to train")
    args = ap.parse_args()

    # 1. Merges trained on whole strings (one word each), so they cross pre-token boundaries.
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + args.merges,
        min_frequency=1,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    # (Not on the string with the unreachable token, which would teach its merges.)
    corpus = [seg for s in STRINGS if "qqq" not in s for seg, special in split_specials(s) if not special]
    trainer_tok.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = trained["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in trained["merges"]]
    assert UNREACHABLE not in vocab
    first_special = len(tokens) + 1
    tokens = tokens + [UNREACHABLE] + SPECIALS
    token_types = [1] * first_special + [3] * len(SPECIALS)
    ids = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}

    # 2. The reference: regex split, then BPE, in plain Python.
    cases = []
    crossing = 0
    for text in STRINGS:
        pieces, want = [], []
        for seg, special in split_specials(text):
            if special:
                pieces.append(seg)
                want.append(ids[seg])
                continue
            seg_pieces = regex.findall(O200K, seg)
            assert "".join(seg_pieces) == seg, (seg, seg_pieces)
            pieces += seg_pieces
            for p in seg_pieces:
                want += [ids[t] for t in bpe(byte_level(p), ranks)]
        # How many ids a boundary-blind BPE would give differently (the test's sensitivity).
        blind = []
        for seg, special in split_specials(text):
            blind += [ids[seg]] if special else [ids[t] for t in bpe(byte_level(seg), ranks)]
        crossing += blind != want
        cases.append({"text": text, "pieces": pieces, "ids": want})
    assert crossing >= len(STRINGS) // 2, f"only {crossing} strings are boundary-sensitive"

    # 3. Hugging Face tokenizers with o200k's tokenizer.json pre-tokenizer agrees.
    hf = Tokenizer(models.BPE(vocab=ids, merges=[tuple(m.split(" ")) for m in merges], ignore_merges=False))
    hf.pre_tokenizer = o200k_pre_tokenizer()
    hf.add_special_tokens(SPECIALS)
    for case in cases:
        text = case["text"]
        got_ids = hf.encode(text, add_special_tokens=False).ids
        assert got_ids == case["ids"], (text, got_ids, case["ids"])
        hf_pieces = []
        for seg, special in split_specials(text):
            if special:
                hf_pieces.append(seg)
            else:
                hf_pieces += [seg[a:b] for _, (a, b) in hf.pre_tokenizer.pre_tokenize_str(seg)]
        assert hf_pieces == case["pieces"], (text, hf_pieces, case["pieces"])
    assert cases[-1]["ids"] != [ids[UNREACHABLE]] * 2

    doc = {
        "about": "tools/golden/make_gpt4o_tokenizer_golden.py: o200k pre-token pieces (Python `regex`) "
        "and BPE ids (plain Python, no ignore_merges) of a small byte-level vocab; agrees with "
        f"Hugging Face tokenizers {tokenizers.__version__} using o200k's tokenizer.json pre-tokenizer",
        "pattern": O200K,
        "tokens": tokens,
        "token_types": token_types,
        "merges": merges,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{args.out}: {len(tokens)} tokens, {len(merges)} merges, {len(cases)} strings "
          f"({crossing} where a boundary changes the ids)")


if __name__ == "__main__":
    main()
