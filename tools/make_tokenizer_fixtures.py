#!/usr/bin/env python3
"""Builds small Hugging Face tokenizers and their reference outputs for kvgraph.

    python3 tools/make_tokenizer_fixtures.py --out tests/fixtures/tokenizers

Needs the `tokenizers` package (written against 0.23) and nothing else: no
network, no downloads. Each tokenizer is trained here on the text embedded
below, in the layout of a real model family:

  llama3_bpe        byte-level BPE, Llama-3 Split regex + ByteLevel(use_regex=False),
                    ignore_merges, <|begin_of_text|> added by TemplateProcessing
  gpt2_bpe          byte-level BPE, ByteLevel with GPT-2's own regex, NFC, Qwen2-style
                    specials (<|endoftext|>, <|im_start|>, <|im_end|>), merges in the
                    older "a b" string form
  qwen2_bpe         byte-level BPE, NFC + Qwen2 Split regex + ByteLevel(use_regex=False)
  sp_bpe            SentencePiece-style BPE with byte_fallback, Metaspace(prepend
                    "first", no split) as Mistral / Llama-2 (current conversion),
                    decoder Replace+ByteFallback+Fuse+Strip, <s> via TemplateProcessing
  sp_legacy_bpe     the same model with the legacy Llama-2 normalizer form (Prepend
                    "▁" + Replace " " -> "▁", no pre-tokenizer) and added tokens with
                    lstrip / rstrip / single_word / normalized flags
  gemma_bpe         Gemma layout: Replace normalizer only, <bos> template, byte_fallback
  metaspace_bpe     Metaspace(prepend "always", split) + Metaspace decoder, unk
                    without byte fallback

For each, <out>/<name>/ gets tokenizer.json, tokenizer_config.json and
cases.json: for every text, tokenizers' ids with and without special tokens
and its decode of those ids (keeping and skipping special tokens), plus
decode-only cases of random ids. tests/tokenizer/ checks kvgraph against them.
"""
import argparse
import json
import random
import sys
from pathlib import Path

# Pre-tokenizer regexes, exactly as the Llama-3 and Qwen2 tokenizer.json files have them.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Training text: a few KB of varied prose, code, numbers and other scripts.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away into the woods.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.
In the beginning the Universe was created. This has made a lot of people very angry and been widely regarded as a bad move.
Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in my purse, I thought I would sail about a little.
I'm sure you'll find that it's what they've said; we'd rather not, but they're going and I'd go too.
She said: "Don't worry, we'll be there at 10:30 on Monday, 12 March 2024." He replied, 'OK!'
Tokenizers split text into pieces; byte-level BPE never needs an unknown token, because every byte has a symbol.
SentencePiece marks word starts with a special underline character and falls back to bytes for rare characters.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1000 1024 2048 65536 3.14159 2.71828 1e-5 -17 +3 50% $19.99 #1
Dates and times: 2023-01-15, 15/01/2023, 08:45:00, Q3 FY2024, the 1990s, 21st century.
def tokenize(text: str) -> list[int]:
    ids = []
    for word in text.split():
        ids.extend(vocab.get(word, [UNK]))
    return ids

for (int i = 0; i < n; ++i) {
    sum += values[i] * weights[i];
}
if (x != nullptr && x->size() > 0) { return x->front(); } else { throw std::runtime_error("empty"); }
{"name": "kvgraph", "version": "0.1.0", "tags": ["llm", "runtime"], "gpu": true, "layers": 32}
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;  -- comment
<html><body><p class="note">Hello &amp; welcome!</p></body></html>
https://example.com/docs/index.html?lang=en&page=2#section-3 user@example.org
Zażółć gęślą jaźń. Ça va très bien, merci! Über straße, naïve café, façade, jalapeño, smörgåsbord.
¿Dónde está la biblioteca? La biblioteca está cerca de la estación.
Привет, мир! Как дела? Москва — столица России. Съешь же ещё этих мягких французских булок.
Καλημέρα κόσμε, τι κάνεις; Η γλώσσα είναι όμορφη.
我爱自然语言处理。今天天气很好，我们去公园散步吧！中文分词是一个有趣的问题。
日本語のテキストも少し入れておきます。こんにちは、世界！ひらがなとカタカナと漢字。
한국어 문장도 있습니다. 안녕하세요, 만나서 반갑습니다.
مرحبا بالعالم! كيف حالك اليوم؟ اللغة العربية جميلة جدا.
שלום עולם, מה שלומך היום?
नमस्ते दुनिया! आप कैसे हैं? हिंदी भाषा बहुत सुंदर है।
สวัสดีครับ ยินดีที่ได้รู้จัก
Emoji: 😀 😃 😄 😁 🎉 🚀 ❤️ 👍 👍🏽 🇫🇷 👩‍💻 👨‍👩‍👧‍👦
Whitespace:  two  spaces,   three   spaces,\ttabs\tand
blank lines


and trailing spaces   
    indented code line
The model reads the prompt, then generates one token at a time until it emits the end-of-sequence token.
Every decode step is the same computation except for a few integers: the position, the active length, the write slot.
"""

# Texts to encode. Every fixture gets all of them: special-token spellings of
# other families are ordinary text there.
CASES = [
    "",
    "Hello world",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple   spaces   inside    words",
    "tabs\tand\nnewlines\r\n\nand more\n\n\n",
    "\n",
    " ",
    "   ",
    "\t\t",
    " \n \n  ",
    "I'm sure they'll say it's fine, we've done what we'd planned.",
    "DON'T SHOUT! I'LL BE THERE, YOU'RE RIGHT",
    "The year 2024 had 366 days; pi is about 3.14159265358979",
    "1234567890 12345 123 1,000,000 0.5+0.25=0.75",
    "Phone: +1 (555) 010-9999, ext. 42",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += v[i]; }",
    '{"key": [1, 2, 3], "ok": true, "nested": {"x": null}}',
    '<div class="x">&nbsp;</div>',
    "https://example.com/path?q=1&r=two#frag and mail@example.org",
    "我爱自然语言处理。今天天气很好！",
    "这是一个没有在训练文本里出现过的句子：龘靐齉爩。",
    "こんにちは世界、カタカナとひらがな",
    "안녕하세요 세계",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "Привет, мир! Как дела?",
    "Καλημέρα κόσμε",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก",
    "¿Qué tal? ¡Muy bien! Ça va, naïve café, Straße, Ærøskøbing",
    "I \u2764\ufe0f emoji \U0001F600\U0001F389\U0001F44D\U0001F3FD",
    "\U0001F469\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family, \U0001F3F3\ufe0f\u200d\U0001F308 flag, "
    "\U0001F468\U0001F3FB\u200d\U0001F4BB coder",
    "\U0001F1EB\U0001F1F7\U0001F1EF\U0001F1F5 flags and \U0001F9D1\u200d\U0001F52C science",
    "\U0001F600",
    "e\u0301 vs \u00e9; A\u030a vs \u00c5; \ufb01 ligature; \u2460 circled; full-width \uff21\uff22\uff23",
    "\u00a0nbsp\u00a0and\u2003em space\u3000ideographic",
    "NEL\u0085char and line\u2028separator",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "control \x01\x02\x7f chars",
    "replacement \ufffd char",
    "\u017f 'S 'ſ \u01c4 \u01c5 \u01c6 \u0130stanbul",
    "Supercalifragilisticexpialidocious",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "=================================",
    "mixedCASE_snake_case-kebab-case camelCase",
    "Hello <s> world</s> and <unk>",
    "<s>Starts with bos",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "[INST] What is the capital of France? [/INST] Paris.</s>",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>gemma<eos>",
    "a <mask> b <mask>c<mask>  d",
    "x <sep>   y<sep>z",
    "ab abc ab_ xab ab, (ab) ab",
    "tool tools mytool tool.",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "The model reads the prompt, then generates one token at a time until it emits the end-of-sequence "
    "token. Every decode step is the same computation except for a few integers: the position, the "
    "active length, the write slot. 我们去公园散步吧！ Привет! \U0001F680",
]

# Decode-only cases of random ids per fixture.
RANDOM_DECODE_CASES = 40


def corpus_lines():
    lines = CORPUS.splitlines(keepends=True)
    # A few passes so that min_frequency keeps the rarer scripts.
    for _ in range(3):
        yield from lines


def merges_as_pairs(merges):
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


def trained_model(tok):
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], merges_as_pairs(model["merges"])


def train_byte_level(pre_tokenizer, normalizer, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return trained_model(tok)


def train_sentencepiece_style(vocab_size, specials):
    """BPE over Metaspace words; the vocab is laid out like Llama-2's: specials,
    then the 256 <0xNN> byte tokens, then the learned pieces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[])
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    learned, merges = trained_model(tok)
    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for token, _ in sorted(learned.items(), key=lambda kv: kv[1]):
        if token not in vocab:
            vocab[token] = len(vocab)
    return vocab, merges


def sp_decoder():
    from tokenizers import decoders

    return decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )


def build_llama3():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    vocab, merges = train_byte_level(pre, None, 1000)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return tok, config


def qwen_style(tok):
    from tokenizers import AddedToken

    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]]
    )
    # Qwen2.5 marks its tool-call tags as added but not special.
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ["<tool_call>", "</tool_call>"]])
    return {
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def build_gpt2():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    vocab, merges = train_byte_level(pre, normalizers.NFC(), 800)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, qwen_style(tok)


def build_qwen2():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    vocab, merges = train_byte_level(pre, normalizers.NFC(), 900)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, qwen_style(tok)


def llama2_config():
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False},
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False},
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "legacy": False,
        "model_max_length": 4096,
        "tokenizer_class": "LlamaTokenizer",
    }


def sp_model(vocab, merges, **kwargs):
    from tokenizers import models

    return models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True, **kwargs)


def bos_template(tok, bos):
    from tokenizers import processors

    return processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tok.token_to_id(bos))]
    )


def build_sp():
    from tokenizers import AddedToken, Tokenizer, pre_tokenizers

    vocab, merges = train_sentencepiece_style(900, ["<unk>", "<s>", "</s>"])
    tok = Tokenizer(sp_model(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = sp_decoder()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    # Mistral-style control tokens, added after the vocabulary.
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["[INST]", "[/INST]"]])
    tok.post_processor = bos_template(tok, "<s>")
    return tok, llama2_config()


def build_sp_legacy():
    from tokenizers import AddedToken, Tokenizer, normalizers

    vocab, merges = train_sentencepiece_style(900, ["<unk>", "<s>", "</s>"])
    tok = Tokenizer(sp_model(vocab, merges))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = sp_decoder()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    tok.add_special_tokens(
        [
            AddedToken("<mask>", lstrip=True, rstrip=False, single_word=False, normalized=False, special=True),
            AddedToken("<sep>", lstrip=False, rstrip=True, single_word=False, normalized=False, special=True),
        ]
    )
    tok.add_tokens(
        [
            AddedToken("ab", single_word=True, normalized=False, special=False),
            AddedToken("tool", normalized=True, special=False),
        ]
    )
    tok.post_processor = bos_template(tok, "<s>")
    config = llama2_config()
    config["legacy"] = True
    return tok, config


def build_gemma():
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab, merges = train_sentencepiece_style(900, specials)
    from tokenizers import models

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in ["<start_of_turn>", "<end_of_turn>"]]
    )
    tok.post_processor = bos_template(tok, "<bos>")
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "tokenizer_class": "GemmaTokenizer",
    }
    return tok, config


def build_metaspace():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = train_sentencepiece_style(700, ["<unk>", "<s>", "</s>"])
    # No byte fallback here: characters outside the vocabulary become <unk>.
    vocab = {t: i for t, i in vocab.items() if not (t.startswith("<0x") and len(t) == 6)}
    vocab = {t: n for n, (t, _) in enumerate(sorted(vocab.items(), key=lambda kv: kv[1]))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = bos_template(tok, "<s>")
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    return tok, config


BUILDERS = {
    "llama3_bpe": build_llama3,
    "gpt2_bpe": build_gpt2,
    "qwen2_bpe": build_qwen2,
    "sp_bpe": build_sp,
    "sp_legacy_bpe": build_sp_legacy,
    "gemma_bpe": build_gemma,
    "metaspace_bpe": build_metaspace,
}

# Fixtures whose tokenizer.json is rewritten with merges as "a b" strings, the
# form older files use (the tokens there contain no spaces, so it is exact).
LEGACY_MERGES = {"gpt2_bpe", "sp_legacy_bpe"}


def reference_cases(tok):
    cases = []
    for text in CASES:
        with_special = tok.encode(text, add_special_tokens=True)
        plain = tok.encode(text, add_special_tokens=False)
        cases.append(
            {
                "text": text,
                "ids": with_special.ids,
                "ids_plain": plain.ids,
                "tokens": with_special.tokens,
                "decoded": tok.decode(with_special.ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(with_special.ids, skip_special_tokens=True),
            }
        )
    return cases


def random_decode_cases(tok, seed):
    """Decode-only cases: random ids, so byte tokens meet in every order,
    including sequences that are not valid UTF-8."""
    rng = random.Random(seed)
    vocab = tok.get_vocab(with_added_tokens=True)
    n = max(vocab.values()) + 1
    byte_ids = sorted(i for t, i in vocab.items() if t.startswith("<0x") and len(t) == 6)
    out = []
    for k in range(RANDOM_DECODE_CASES):
        length = rng.randint(1, 12)
        if byte_ids and k % 2 == 0:
            # Mostly byte tokens: broken and complete UTF-8 sequences.
            ids = [rng.choice(byte_ids) if rng.random() < 0.7 else rng.randrange(n) for _ in range(length)]
        else:
            ids = [rng.randrange(n) for _ in range(length)]
        out.append(
            {
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True),
            }
        )
    return out


def dump_cases(obj):
    """JSON with one line per case: small, and diffs stay readable."""
    lines = ["{"]
    items = list(obj.items())
    for k, (key, value) in enumerate(items):
        comma = "," if k + 1 < len(items) else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f" {json.dumps(key)}: [")
            for i, v in enumerate(value):
                lines.append("  " + json.dumps(v, ensure_ascii=False) + ("," if i + 1 < len(value) else ""))
            lines.append(" ]" + comma)
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def rewrite_merges_as_strings(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    merges = data["model"]["merges"]
    if any(" " in a or " " in b for a, b in merges_as_pairs(merges)):
        return False
    data["model"]["merges"] = [" ".join(m) for m in merges_as_pairs(merges)]
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return True


def make_fixture(name, out_dir, seed):
    from tokenizers import Tokenizer

    tok, config = BUILDERS[name]()
    folder = out_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer_path = folder / "tokenizer.json"
    tok.save(str(tokenizer_path))
    if name in LEGACY_MERGES:
        if not rewrite_merges_as_strings(tokenizer_path):
            print(f"{name}: merges kept as pairs (a token has a space)", file=sys.stderr)
    # The reference comes from the file as written, reloaded: that is what kvgraph reads.
    tok = Tokenizer.from_file(str(tokenizer_path))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n",
                                                  encoding="utf-8")

    def id_of(key):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return tok.token_to_id(value) if value else None

    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    cases = {
        "tokenizer": name,
        "tokenizers_version": __import__("tokenizers").__version__,
        "vocab_size": max(vocab.values()) + 1,
        "bos_id": id_of("bos_token"),
        "eos_id": id_of("eos_token"),
        "special_tokens": sorted([t.content, i] for i, t in added.items() if t.special),
        "added_tokens": sorted([t.content, i] for i, t in added.items() if not t.special),
        "cases": reference_cases(tok),
        "decode_cases": random_decode_cases(tok, seed),
    }
    (folder / "cases.json").write_text(dump_cases(cases), encoding="utf-8")
    print(f"{name}: vocab {cases['vocab_size']}, {len(cases['cases'])} cases -> {folder}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write <name>/ fixtures into")
    parser.add_argument("--only", nargs="*", choices=sorted(BUILDERS), help="build only these")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError:
        sys.exit("make_tokenizer_fixtures.py needs the `tokenizers` package")
    print(f"tokenizers {tokenizers.__version__}")
    for name in args.only or BUILDERS:
        make_fixture(name, args.out, args.seed)


if __name__ == "__main__":
    main()
