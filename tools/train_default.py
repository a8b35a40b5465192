#!/usr/bin/env python3
"""Train kvgraph's small embedded default model (a tiny Gemma-3-style decoder).

Everything is built locally -- tokenizer, config, weights -- so the script runs
on a machine without internet access. It needs torch, transformers (v5),
tokenizers and safetensors, and a GPU for the default settings.

    python3 tools/train_default.py --corpus data/corpus --out models/default --minutes 4

Steps
  1. Train a byte-level BPE tokenizer (GPT-2 ByteLevel pre-tokenizer, no
     normalizer, specials <pad>=0 <eos>=1 <bos>=2, TemplateProcessing adding
     <bos>) on the training split.
  2. Build a Gemma3TextConfig with both sliding-window and full-attention layers.
  3. Train with AdamW + bf16 autocast on 256-token windows of the concatenated
     entry stream "<bos> entry <eos> <bos> entry <eos> ...", warmup + cosine LR.
     Training stops at the planned number of epochs or when the wall-clock
     budget (--minutes, counted from script start, minus a reserve for the
     final evaluation and saving) runs out, whichever comes first. The
     checkpoint with the best validation loss (data/corpus/valid.txt) is kept.
  4. Evaluate held-out perplexity (data/corpus/heldout.txt) with the saved
     bf16 weights in float32 math, print sample continuations.
  5. Save the model (safetensors, bf16), tokenizer files, generation_config.json,
     heldout_eval.json (numbers + reference token ids/logits for C++ tests) and
     the model card README.md into --out.

Corpus format: see tools/prepare_corpus.py (entries separated by lines "%").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import sys
import time

T_START = time.time()

# No network on the training machine: never let huggingface_hub try.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2  # same ids as Gemma's defaults
SEPARATOR_LINE = "%"

SAMPLE_PROMPTS = [
    "The meaning of life is",
    "A computer is",
    "Love is",
    "The best way to",
    "Never trust",
]

TOKENIZER_CASES = [
    "Hello world",
    "The meaning of life is",
    "  leading spaces, trailing spaces  ",
    "Tabs\tand\nnewlines\n\n\t\t-- Author",
    "Unicode: caf\u00e9, \u201cquotes\u201d, \u00a35, \u2014 dash",
    "Numbers 1234567890 and symbols #$%&*()[]{}",
]


def log(msg: str) -> None:
    print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------- data


def read_entries(path: str) -> list[str]:
    """Parse a fortune-format file: entries separated by lines equal to '%'."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    entries, cur = [], []
    for line in text.split("\n"):
        if line == SEPARATOR_LINE:
            entries.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur and any(cur):
        entries.append("\n".join(cur))
    return [e for e in entries if e.strip()]


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


# ---------------------------------------------------------------------- tokenizer


def train_tokenizer(entries: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())  # no unk token, no byte fallback (bytes are in the alphabet)
    # Plain byte-level BPE: no normalizer; GPT-2 regex split + byte mapping.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, EOS, BOS],  # -> ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(entries, trainer=trainer, length=len(entries))
    for name, want in ((PAD, PAD_ID), (EOS, EOS_ID), (BOS, BOS_ID)):
        got = tok.token_to_id(name)
        if got != want:
            raise RuntimeError(f"special token {name} got id {got}, expected {want}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B:1",
        special_tokens=[(BOS, BOS_ID)],
    )
    return tok


def encode_entries(tok, entries: list[str]) -> list[np.ndarray]:
    encs = tok.encode_batch(entries, add_special_tokens=False)
    return [np.asarray([BOS_ID] + e.ids + [EOS_ID], dtype=np.int64) for e in encs]


def save_tokenizer_files(tok, out: str, max_len: int) -> None:
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    smap = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    with open(os.path.join(out, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(smap, f, indent=2)
        f.write("\n")


# -------------------------------------------------------------------------- model


def build_config(args, vocab_size: int):
    from transformers import Gemma3TextConfig

    pattern = max(1, args.full_every)
    layer_types = [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(args.layers)
    ]
    if "full_attention" not in layer_types:
        layer_types[-1] = "full_attention"
    if "sliding_attention" not in layer_types:
        raise SystemExit("need at least one sliding layer: use --full-every >= 2 and --layers >= 2")
    return Gemma3TextConfig(
        vocab_size=int(vocab_size),
        hidden_size=int(args.hidden),
        intermediate_size=int(args.intermediate),
        num_hidden_layers=int(args.layers),
        num_attention_heads=int(args.heads),
        num_key_value_heads=int(args.kv_heads),
        head_dim=int(args.head_dim),
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=int(args.max_positions),
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": float(args.rope_local)},
            "full_attention": {"rope_type": "default", "rope_theta": float(args.rope_global)},
        },
        attention_bias=False,
        attention_dropout=0.0,
        query_pre_attn_scalar=int(args.head_dim),
        sliding_window=int(args.window),
        layer_types=layer_types,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    )


def add_dropout_hooks(model, p: float) -> int:
    """Residual-branch + embedding dropout (Gemma3 has no dropout of its own).

    Applied to the outputs of the post-attention / post-feedforward norms (the
    branch right before it is added to the residual) and to the scaled
    embeddings. Active only in train mode.
    """
    if p <= 0:
        return 0
    n = 0

    def hook(module, inputs, output):
        return F.dropout(output, p=p, training=module.training)

    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("post_attention_layernorm", "post_feedforward_layernorm", "embed_tokens"):
            mod.register_forward_hook(hook)
            n += 1
    return n


def patch_config_compat(path: str, args) -> None:
    """Add the transformers-4.x spellings of the RoPE / pattern fields.

    transformers v5 writes `rope_parameters` (per layer type) and `layer_types`;
    v4 readers (and simple C++ parsers) look for `rope_theta`,
    `rope_local_base_freq` and `sliding_window_pattern`. v5 accepts and drops
    these keys when loading, so adding them keeps both readers happy.
    """
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg.setdefault("rope_theta", float(args.rope_global))
    cfg.setdefault("rope_local_base_freq", float(args.rope_local))
    cfg.setdefault("sliding_window_pattern", int(args.full_every))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


# ----------------------------------------------------------------------- training


def make_epoch_batches(encoded, seq: int, rng: np.random.Generator, device):
    """Shuffle entries, concatenate, cut into (seq+1)-token windows, shuffle rows."""
    order = rng.permutation(len(encoded))
    stream = np.concatenate([encoded[i] for i in order])
    offset = int(rng.integers(0, seq))
    stream = stream[offset:]
    n = (len(stream) - 1) // seq
    x = torch.from_numpy(stream[: n * seq].reshape(n, seq).copy())
    y = torch.from_numpy(stream[1 : n * seq + 1].reshape(n, seq).copy())
    perm = torch.from_numpy(rng.permutation(n))
    return x[perm].to(device, non_blocking=True), y[perm].to(device, non_blocking=True)


def make_eval_chunks(encoded, chunk_len: int):
    stream = np.concatenate(encoded) if encoded else np.zeros(0, dtype=np.int64)
    n = len(stream) // chunk_len
    chunks = torch.from_numpy(stream[: n * chunk_len].reshape(n, chunk_len).copy())
    return chunks, int(len(stream)), int(len(stream) - n * chunk_len)


@torch.no_grad()
def eval_nll(model, chunks, device, batch: int = 32, autocast: bool = False):
    """Sum and count of NLL predicting tokens 1..N-1 of each chunk independently.

    Returns (sum_nll, n_predicted, per_chunk_mean_nll list).
    """
    was_training = model.training
    model.eval()
    total, count, per_chunk = 0.0, 0, []
    for i in range(0, chunks.shape[0], batch):
        x = chunks[i : i + batch].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x, use_cache=False).logits
        logits = logits[:, :-1].float()
        tgt = x[:, 1:]
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none"
        ).view(tgt.shape).double()
        total += float(nll.sum())
        count += int(nll.numel())
        per_chunk.extend(nll.mean(dim=1).tolist())
    if was_training:
        model.train()
    return total, count, per_chunk


def lr_at(step: int, progress: float, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, max(0.0, progress))
    min_lr = args.lr * args.min_lr_ratio
    return min_lr + 0.5 * (args.lr - min_lr) * (1.0 + math.cos(math.pi * p))


# ----------------------------------------------------------------------- sampling


@torch.no_grad()
def generate(model, tok, prompt: str, device, max_new: int, top_k: int, temperature: float,
             generator=None):
    """Plain no-cache generation loop; top_k <= 0 means greedy."""
    ids = tok.encode(prompt).ids  # TemplateProcessing adds <bos>
    x = torch.tensor([ids], dtype=torch.long, device=device)
    new = []
    for _ in range(max_new):
        logits = model(input_ids=x, use_cache=False).logits[0, -1].float()
        if top_k <= 0:
            nxt = int(torch.argmax(logits))
        else:
            v, ix = torch.topk(logits / temperature, top_k)
            probs = torch.softmax(v, dim=-1)
            nxt = int(ix[torch.multinomial(probs, 1, generator=generator)])
        if nxt == EOS_ID:
            break
        new.append(nxt)
        x = torch.cat([x, torch.tensor([[nxt]], device=device)], dim=1)
    return ids, new, tok.decode(new, skip_special_tokens=True)


# ----------------------------------------------------------------------- the card


def md_block(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def write_card(out: str, info: dict) -> None:
    c = info
    arch = c["arch"]
    samples_md = []
    for s in c["samples"]:
        samples_md.append(
            f"**Prompt:** `{s['prompt']}`\n\n"
            f"greedy:\n\n{md_block(s['prompt'] + s['greedy'])}\n\n"
            f"top-k {c['sample_top_k']}, temperature {c['sample_temperature']}, seed {c['seed']}:\n\n"
            f"{md_block(s['prompt'] + s['sampled'])}\n"
        )
    layer_str = ", ".join("S" if t == "sliding_attention" else "F" for t in arch["layer_types"])
    card = f"""---
license: bsd-3-clause
language:
- en
library_name: transformers
pipeline_tag: text-generation
tags:
- gemma3
- kvgraph
- tiny
---

# kvgraph default model (`models/default`)

A tiny Gemma-3-style decoder that kvgraph trains itself and ships as its
built-in default: with no `--model`, kvgraph loads this directory. It exists so
that a fresh checkout can generate text on a CPU in a few seconds, and so that
the default run exercises both cache kinds: sliding-window layers (ring cache)
and full-attention layers (flat cache). It writes fortune-cookie-style English;
it knows nothing else and is not useful as a general language model.

## Data

English text from the Debian fortunes package (fortunes, fortunes-min;
Debian versions: {c['debian_version']}): the fortune(6) cookie files in
`/usr/share/games/fortunes` -- a mix of quotations, jokes, definitions, poems
and aphorisms by many authors. Prepared by `tools/prepare_corpus.py` (cleaned,
de-duplicated, `ascii-art` file and drawing-like entries dropped, no offensive
`off/` files) into `data/corpus/`; the split is by a hash of each entry's text:

| split | file | entries | tokens |
| --- | --- | ---: | ---: |
| train | `data/corpus/fortunes.txt` | {c['n_train_entries']} | {c['n_train_tokens']} |
| validation (checkpoint selection) | `data/corpus/valid.txt` | {c['n_valid_entries']} | {c['n_valid_tokens']} |
| held-out test (reported below) | `data/corpus/heldout.txt` | {c['n_heldout_entries']} | {c['n_heldout_tokens']} |

Token counts include one `<bos>` and one `<eos>` per entry.

License of the data, per `/usr/share/doc/fortunes/copyright`: the BSD license of
the University of California (redistribution with or without modification is
permitted provided the copyright notice, conditions and disclaimer are retained;
the advertising clause was deleted). Individual quotations are attributed to
their authors inside the text. The package is not a public-domain work as such.

## Architecture

`Gemma3ForCausalLM` (`model_type: gemma3_text`), {c['n_params']:,} parameters
(embeddings tied with the output head), weights stored in bfloat16:
`model.safetensors` is {c['weights_bytes']:,} bytes; the whole directory is
{c['dir_bytes']:,} bytes.

| | |
| --- | --- |
| hidden size | {arch['hidden_size']} |
| layers | {arch['num_hidden_layers']} ({layer_str}; S = sliding window, F = full attention) |
| attention heads / KV heads / head dim | {arch['num_attention_heads']} / {arch['num_key_value_heads']} / {arch['head_dim']} |
| MLP | GeGLU (gelu tanh), intermediate size {arch['intermediate_size']} |
| sliding window | {arch['sliding_window']} tokens (a query at position i sees keys i-{arch['sliding_window'] - 1} .. i) |
| RoPE theta | {arch['rope_local']:g} on sliding layers, {arch['rope_global']:g} on full layers |
| attention scale | query_pre_attn_scalar^-0.5 = {arch['head_dim']}^-0.5, with q/k RMSNorm |
| norms | RMSNorm with (1 + weight), eps 1e-6, pre and post norms around attention and MLP |
| embeddings | scaled by sqrt(hidden) = {math.sqrt(arch['hidden_size']):g}, tied to the LM head |
| vocabulary | {arch['vocab_size']} |
| max positions | {arch['max_position_embeddings']} (trained on {c['seq_len']}-token windows) |

Tokenizer: byte-level BPE trained on the training split with the `tokenizers`
library: GPT-2 ByteLevel pre-tokenizer (regex split, no prefix space), no
normalizer, ByteLevel decoder, {c['tok_vocab']} tokens. Special tokens
`<pad>`=0, `<eos>`=1, `<bos>`=2; encoding adds `<bos>` (TemplateProcessing),
never `<eos>`. On the held-out text it averages {c['bytes_per_token']:.2f} bytes
per token.

## Training

    {c['command']}

- Hardware: {c['device_name']}; torch {c['torch_version']}, transformers {c['transformers_version']}, tokenizers {c['tokenizers_version']}.
- Wall time: {c['train_seconds']:.0f} s of training, {c['total_seconds']:.0f} s for the whole script (budget {c['budget_seconds']:.0f} s; stop reason: {c['stop_reason']}).
- {c['steps']} optimizer steps of {c['batch']} x {c['seq_len']} tokens = {c['tokens_seen']:,} tokens seen ({c['epochs_seen']:.1f} epochs over the training split), {c['tokens_per_second']:,.0f} tokens/s.
- AdamW (betas 0.9/0.95, weight decay {c['weight_decay']} on matrices), peak LR {c['lr']}, {c['warmup']} warmup steps, cosine decay to {c['lr'] * c['min_lr_ratio']:.2g}; bf16 autocast, gradient clipping 1.0; dropout {c['dropout']} on embeddings and on both residual branches; seed {c['seed']}.
- Training windows: entries shuffled every epoch and concatenated as `<bos> entry <eos> <bos> entry <eos> ...`, cut into {c['seq_len']}-token windows (attention crosses entry boundaries).
- Checkpoint kept: step {c['best_step']} (epoch {c['best_epoch']:.1f}), the lowest validation loss ({c['best_valid_nll']:.4f} nats/token under bf16 autocast).
- Final training loss (mean over the last {c['last_window_steps']} steps, dropout on): {c['final_train_loss']:.4f}. Training-split loss of the kept checkpoint, measured like the held-out number: {c['train_eval_nll']:.4f} (perplexity {math.exp(c['train_eval_nll']):.2f}).

## Held-out perplexity

**{c['heldout_ppl']:.3f}** (mean NLL {c['heldout_nll']:.5f} nats per predicted token) on `data/corpus/heldout.txt`.

Computed exactly like this, so kvgraph's `perplexity` command can reproduce it:

1. Parse the file into entries (lines equal to `%` separate entries; an entry is
   its lines joined with `\\n`, no trailing newline).
2. Token stream: for each entry in file order, `<bos>` (2), the entry's tokens
   (encoded without special tokens), `<eos>` (1); all concatenated.
3. Cut the stream into non-overlapping chunks of N = {c['chunk_len']} tokens from the
   start; the last {c['dropped_tail']} tokens that do not fill a chunk are dropped
   ({c['n_chunks']} chunks).
4. Run every chunk on its own from an empty cache (positions 0..N-1). Score the
   natural-log NLL of token i+1 given tokens 0..i, for i = 0..N-2 (N-1 predictions
   per chunk; chunk token 0 is never predicted).
5. Mean over all {c['n_predicted']} predictions; perplexity = exp(mean).

Precision: the saved bfloat16 weights converted to float32, all math in float32
(TF32 off). Under bf16 autocast on the GPU the same procedure gives
{c['heldout_ppl_bf16']:.3f}. `heldout_eval.json` holds these numbers, the
chunking parameters, the first chunk's token ids with its mean NLL and top-5
logits at a few positions (before and after the sliding window fills), greedy
reference continuations, and tokenizer test strings with their ids, for the C++
tests.

## Samples

Produced by the training script from the saved weights (float32 math, no KV
cache, at most {c['sample_max_new']} new tokens, stopping at `<eos>`).

{chr(10).join(samples_md)}
## Files

- `config.json`, `generation_config.json`, `model.safetensors` -- Hugging Face format, loads with `transformers.AutoModelForCausalLM`.
- `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json` -- loads with `transformers.AutoTokenizer` or `tokenizers.Tokenizer.from_file`.
- `heldout_eval.json` -- reference numbers for tests.
- `training_log.json` -- validation loss per evaluation and training loss per log window.
- `README.md` -- this card, written by `tools/train_default.py`.
"""
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(card)


# --------------------------------------------------------------------------- main


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--out", default="models/default")
    ap.add_argument("--minutes", type=float, default=4.0,
                    help="wall-clock budget for the whole script, counted from start")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    # tokenizer
    ap.add_argument("--vocab", type=int, default=4096)
    # model
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--full-every", type=int, default=3,
                    help="every k-th layer is full attention, the rest sliding (default 3: S,S,F,S,S,F)")
    ap.add_argument("--rope-local", type=float, default=10000.0)
    ap.add_argument("--rope-global", type=float, default=100000.0)
    ap.add_argument("--max-positions", type=int, default=1024)
    # training
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=24.0,
                    help="planned epochs; the LR schedule spans min(epochs, time budget)")
    ap.add_argument("--max-steps", type=int, default=0, help="hard step cap (0 = none; for smoke tests)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=0, help="steps between validation evals (0 = ~half an epoch)")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (compile time counts)")
    ap.add_argument("--reserve-seconds", type=float, default=-1,
                    help="time kept for final eval/save (default: 15%% of budget, 15..60 s)")
    # evaluation / samples
    ap.add_argument("--eval-chunk", type=int, default=256)
    ap.add_argument("--sample-max-new", type=int, default=60)
    ap.add_argument("--sample-top-k", type=int, default=40)
    ap.add_argument("--sample-temperature", type=float, default=0.8)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    budget = args.minutes * 60.0
    reserve = args.reserve_seconds if args.reserve_seconds >= 0 else min(60.0, max(15.0, 0.15 * budget))
    deadline = T_START + budget - reserve

    import tokenizers
    import transformers
    from transformers import Gemma3ForCausalLM, GenerationConfig

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.cuda.manual_seed_all(args.seed)
    torch.set_float32_matmul_precision("high")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}, device {device} ({device_name})")
    log(f"budget {budget:.0f}s, training deadline at +{deadline - T_START:.0f}s (reserve {reserve:.0f}s)")

    # ---- data
    paths = {s: os.path.join(args.corpus, f) for s, f in
             (("train", "fortunes.txt"), ("valid", "valid.txt"), ("heldout", "heldout.txt"))}
    for p in paths.values():
        if not os.path.isfile(p):
            raise SystemExit(f"missing {p}: run tools/prepare_corpus.py first")
    entries = {s: read_entries(p) for s, p in paths.items()}
    log("entries: " + ", ".join(f"{s} {len(e)}" for s, e in entries.items()))

    # ---- tokenizer
    tok = train_tokenizer(entries["train"], args.vocab)
    tok_vocab = tok.get_vocab_size()
    enc = {s: encode_entries(tok, e) for s, e in entries.items()}
    ntok = {s: int(sum(len(a) for a in v)) for s, v in enc.items()}
    heldout_bytes = sum(len(e.encode("utf-8")) for e in entries["heldout"])
    heldout_text_tokens = ntok["heldout"] - 2 * len(entries["heldout"])
    bytes_per_token = heldout_bytes / max(1, heldout_text_tokens)
    log(f"tokenizer: vocab {tok_vocab}; tokens " + ", ".join(f"{s} {n}" for s, n in ntok.items())
        + f"; {bytes_per_token:.2f} bytes/token on heldout")
    probe = "The meaning of life is"
    log(f"tokenize {probe!r} -> {tok.encode(probe).tokens}")

    # ---- model
    vocab_size = max(args.vocab, tok_vocab)
    config = build_config(args, vocab_size)
    model = Gemma3ForCausalLM(config).to(device)
    n_params = count_params(model)
    n_hooks = add_dropout_hooks(model, args.dropout)
    attn_impl = getattr(model.config, "_attn_implementation", "?")
    log(f"model: {n_params:,} params ({n_params * 2 / 1e6:.1f} MB in bf16), layer_types {config.layer_types}, "
        f"attn {attn_impl}, dropout hooks {n_hooks}")
    fwd_model = torch.compile(model) if args.compile else model

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
        fused=(device.type == "cuda"),
    )

    valid_chunks, _, _ = make_eval_chunks(enc["valid"], args.eval_chunk)
    steps_per_epoch = max(1, ((ntok["train"] - 1) // args.seq) // args.batch)
    planned_steps = max(1, int(round(args.epochs * steps_per_epoch)))
    if args.max_steps > 0:
        planned_steps = min(planned_steps, args.max_steps)
    eval_every = args.eval_every or max(10, steps_per_epoch // 2)
    log(f"{steps_per_epoch} steps/epoch of {args.batch}x{args.seq}; planned {planned_steps} steps "
        f"({planned_steps / steps_per_epoch:.1f} epochs); validation every {eval_every} steps")

    # ---- train
    rng = np.random.default_rng(args.seed)
    use_autocast = device.type in ("cuda", "cpu")
    step, epoch, tokens_seen = 0, 0, 0
    best = {"nll": float("inf"), "step": 0, "state": None}
    history = []
    loss_acc = torch.zeros((), device=device)
    acc_n = 0
    last_losses: list[float] = []
    t_train0 = time.time()
    t_log, tok_log = t_train0, 0
    stop_reason = "planned epochs done"
    model.train()

    def run_valid(tag_step: int):
        s, n, _ = eval_nll(fwd_model, valid_chunks, device, autocast=use_autocast)
        v = s / max(1, n)
        history.append({"step": tag_step, "epoch": tag_step / steps_per_epoch, "valid_nll": v})
        improved = v < best["nll"]
        if improved:
            best.update(nll=v, step=tag_step,
                        state={k: t.detach().clone() for k, t in model.state_dict().items()})
        log(f"  valid step {tag_step:5d} epoch {tag_step / steps_per_epoch:5.2f}: nll {v:.4f} "
            f"ppl {math.exp(v):8.3f}{'  *best' if improved else ''}")

    done = False
    while not done:
        xs, ys = make_epoch_batches(enc["train"], args.seq, rng, device)
        epoch += 1
        for i in range(0, xs.shape[0] - args.batch + 1, args.batch):
            if step >= planned_steps:
                done = True
                break
            if time.time() >= deadline:
                stop_reason = "time budget"
                done = True
                break
            progress = max(step / planned_steps, (time.time() - t_train0) / max(1.0, deadline - t_train0))
            lr = lr_at(step, progress, args)
            for g in opt.param_groups:
                g["lr"] = lr
            x, y = xs[i : i + args.batch], ys[i : i + args.batch]
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_autocast):
                logits = fwd_model(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            tokens_seen += x.numel()
            loss_acc += loss.detach()
            acc_n += 1
            if step % args.log_every == 0 or step == 1:
                mean_loss = float(loss_acc) / acc_n
                last_losses.append(mean_loss)
                now = time.time()
                tps = (tokens_seen - tok_log) / max(1e-9, now - t_log)
                log(f"step {step:5d} epoch {step / steps_per_epoch:5.2f} loss {mean_loss:.4f} "
                    f"lr {lr:.2e} {tps:,.0f} tok/s")
                loss_acc.zero_()
                acc_n = 0
                t_log, tok_log = now, tokens_seen
            if step % eval_every == 0:
                run_valid(step)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if acc_n:
        last_losses.append(float(loss_acc) / acc_n)
    if not history or history[-1]["step"] != step:
        run_valid(step)
    train_seconds = time.time() - t_train0
    final_train_loss = last_losses[-1] if last_losses else float("nan")
    log(f"training stopped ({stop_reason}) after {step} steps, {tokens_seen:,} tokens, "
        f"{train_seconds:.1f}s; best valid nll {best['nll']:.4f} at step {best['step']}")
    if best["step"] == step and step >= planned_steps:
        log("  note: best checkpoint is the last one -- more epochs may help (--epochs)")
    elif best["step"] < 0.5 * step:
        log("  note: validation loss bottomed out early -- fewer epochs or more dropout may help")

    # ---- final model: best checkpoint, rounded to bf16, evaluated in fp32
    model.load_state_dict(best["state"])
    best["state"] = None
    model.eval()
    # Round the parameters to bf16 (what gets saved) but keep them in fp32 storage.
    # Only parameters: module.to(bf16) would also round buffers such as RoPE inv_freq.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    heldout_chunks, heldout_stream_len, dropped_tail = make_eval_chunks(enc["heldout"], args.eval_chunk)
    s_bf16, n_bf16, _ = eval_nll(model, heldout_chunks, device, autocast=use_autocast)
    torch.set_float32_matmul_precision("highest")
    s32, n32, per_chunk = eval_nll(model, heldout_chunks, device, autocast=False)
    heldout_nll = s32 / n32
    heldout_nll_bf16 = s_bf16 / n_bf16
    train_chunks, _, _ = make_eval_chunks(enc["train"][:2000], args.eval_chunk)
    st, nt, _ = eval_nll(model, train_chunks[:128], device, autocast=False)
    train_eval_nll = st / nt
    log(f"HELD-OUT: mean nll {heldout_nll:.5f}, perplexity {math.exp(heldout_nll):.4f} "
        f"({heldout_chunks.shape[0]} chunks x {args.eval_chunk}, fp32 math on bf16 weights); "
        f"bf16 autocast: ppl {math.exp(heldout_nll_bf16):.4f}; train-split ppl {math.exp(train_eval_nll):.4f}")

    # reference logits for C++ tests
    first = heldout_chunks[0:1].to(device)
    with torch.no_grad():
        lg = model(input_ids=first, use_cache=False).logits[0].float()
    ref_positions = sorted({p for p in (0, 1, 2, args.window - 1, args.window, args.window + 1,
                                        args.eval_chunk // 2, args.eval_chunk - 2) if 0 <= p < args.eval_chunk})
    top5 = {}
    for p in ref_positions:
        v, ix = torch.topk(lg[p], 5)
        top5[str(p)] = [[int(a), round(float(b), 5)] for a, b in zip(ix.tolist(), v.tolist())]

    # ---- samples
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    samples, greedy_refs = [], []
    for prompt in SAMPLE_PROMPTS:
        p_ids, g_new, g_text = generate(model, tok, prompt, device, args.sample_max_new, 0, 1.0)
        _, _, s_text = generate(model, tok, prompt, device, args.sample_max_new,
                                args.sample_top_k, args.sample_temperature, gen)
        samples.append({"prompt": prompt, "greedy": g_text, "sampled": s_text})
        greedy_refs.append({"prompt": prompt, "prompt_ids": p_ids, "greedy_new_ids": g_new[:32],
                            "greedy_text": tok.decode(g_new[:32], skip_special_tokens=True)})
        log(f"PROMPT {prompt!r}\n  greedy : {prompt + g_text!r}\n  sampled: {prompt + s_text!r}")

    # ---- save
    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        do_sample=True, temperature=args.sample_temperature, top_k=args.sample_top_k,
        max_new_tokens=128,
    )
    model.save_pretrained(args.out)
    wpath = os.path.join(args.out, "model.safetensors")
    if not os.path.isfile(wpath):
        raise SystemExit(f"save_pretrained did not write {wpath}: {sorted(os.listdir(args.out))}")
    if not os.path.isfile(os.path.join(args.out, "generation_config.json")):
        model.generation_config.save_pretrained(args.out)
    save_tokenizer_files(tok, args.out, args.max_positions)
    patch_config_compat(os.path.join(args.out, "config.json"), args)

    # ---- round-trip checks (non-fatal)
    try:
        with open(os.path.join(args.out, "config.json")) as f:
            saved_cfg = json.load(f)
        log(f"config.json: model_type {saved_cfg.get('model_type')}, architectures {saved_cfg.get('architectures')}, "
            f"layer_types {saved_cfg.get('layer_types')}, rope_parameters {saved_cfg.get('rope_parameters')}")
        from safetensors import safe_open
        with safe_open(wpath, framework="pt") as sf:
            keys = list(sf.keys())
            dtypes = {str(sf.get_tensor(k).dtype) for k in keys}
        log(f"model.safetensors: {len(keys)} tensors, dtypes {sorted(dtypes)}, "
            f"lm_head stored: {any(k.startswith('lm_head') for k in keys)}")
        re_model = Gemma3ForCausalLM.from_pretrained(args.out, dtype=torch.float32).to(device).eval()
        s_re, n_re, _ = eval_nll(re_model, heldout_chunks[:1], device)
        log(f"reload check: first-chunk nll {s_re / n_re:.6f} vs {per_chunk[0]:.6f} in memory")
        del re_model
    except Exception as e:  # noqa: BLE001
        log(f"WARNING: model reload check failed: {type(e).__name__}: {e}")
    try:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(args.out)
        for case in TOKENIZER_CASES:
            a = hf_tok(case)["input_ids"]
            b = tok.encode(case).ids
            if list(a) != list(b):
                log(f"WARNING: AutoTokenizer ids differ for {case!r}: {a} vs {b}")
        log(f"AutoTokenizer check done ({type(hf_tok).__name__})")
    except Exception as e:  # noqa: BLE001
        log(f"WARNING: AutoTokenizer check failed: {type(e).__name__}: {e}")

    # ---- heldout_eval.json
    heldout_path = paths["heldout"]
    eval_json = {
        "heldout_file": os.path.relpath(heldout_path),
        "heldout_sha256": sha256_file(heldout_path),
        "entry_format": "entries are separated by lines equal to '%'; an entry is its lines joined with '\\n' "
                        "(no trailing newline); empty entries are skipped",
        "token_stream": "for each entry in file order: [<bos>=2] + encode(entry, no special tokens) + [<eos>=1], "
                        "concatenated",
        "chunk_len": args.eval_chunk,
        "num_chunks": int(heldout_chunks.shape[0]),
        "stream_tokens": heldout_stream_len,
        "dropped_tail_tokens": dropped_tail,
        "scoring": "each chunk runs alone from an empty cache at positions 0..N-1; natural-log NLL of token i+1 "
                   "given tokens 0..i for i in 0..N-2; mean over all predictions of all chunks; ppl = exp(mean)",
        "predicted_tokens": n32,
        "precision": "bf16 weights as saved, upcast to float32, float32 math (TF32 off)",
        "mean_nll": heldout_nll,
        "perplexity": math.exp(heldout_nll),
        "bf16_autocast": {"mean_nll": heldout_nll_bf16, "perplexity": math.exp(heldout_nll_bf16)},
        "per_chunk_mean_nll_first8": [round(v, 6) for v in per_chunk[:8]],
        "first_chunk": {
            "token_ids": [int(t) for t in heldout_chunks[0].tolist()],
            "mean_nll": per_chunk[0],
            "top5_logits_at_position": top5,
        },
        "first_entry": {
            "text": entries["heldout"][0],
            "ids_without_specials": tok.encode(entries["heldout"][0], add_special_tokens=False).ids,
        },
        "tokenizer_cases": [
            {"text": t, "ids_with_bos": tok.encode(t).ids} for t in TOKENIZER_CASES
        ],
        "greedy_reference": {
            "note": "argmax decoding, float32 math, no KV cache; near-ties may flip in other implementations",
            "cases": greedy_refs,
        },
    }
    with open(os.path.join(args.out, "heldout_eval.json"), "w", encoding="utf-8") as f:
        json.dump(eval_json, f, indent=1, ensure_ascii=False)
        f.write("\n")

    # ---- card
    total_seconds = time.time() - T_START
    cmd_args = " ".join(sys.argv[1:])
    info = {
        "arch": {
            "hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim, "intermediate_size": config.intermediate_size,
            "sliding_window": config.sliding_window, "layer_types": list(config.layer_types),
            "rope_local": args.rope_local, "rope_global": args.rope_global,
            "vocab_size": config.vocab_size, "max_position_embeddings": config.max_position_embeddings,
        },
        "debian_version": _debian_version(args.corpus),
        "n_train_entries": len(entries["train"]), "n_valid_entries": len(entries["valid"]),
        "n_heldout_entries": len(entries["heldout"]),
        "n_train_tokens": ntok["train"], "n_valid_tokens": ntok["valid"], "n_heldout_tokens": ntok["heldout"],
        "n_params": n_params,
        "weights_bytes": os.path.getsize(wpath),
        "dir_bytes": 0,
        "tok_vocab": tok_vocab, "bytes_per_token": bytes_per_token,
        "seq_len": args.seq, "batch": args.batch,
        "command": f"python3 tools/train_default.py {cmd_args}".strip(),
        "device_name": device_name, "torch_version": torch.__version__,
        "transformers_version": transformers.__version__, "tokenizers_version": tokenizers.__version__,
        "train_seconds": train_seconds, "total_seconds": total_seconds, "budget_seconds": budget,
        "stop_reason": stop_reason, "steps": step, "tokens_seen": tokens_seen,
        "epochs_seen": tokens_seen / max(1, ntok["train"]),
        "tokens_per_second": tokens_seen / max(1e-9, train_seconds),
        "weight_decay": args.weight_decay, "lr": args.lr, "min_lr_ratio": args.min_lr_ratio,
        "warmup": args.warmup, "dropout": args.dropout, "seed": args.seed,
        "best_step": best["step"], "best_epoch": best["step"] / steps_per_epoch, "best_valid_nll": best["nll"],
        "last_window_steps": args.log_every, "final_train_loss": final_train_loss,
        "train_eval_nll": train_eval_nll,
        "heldout_ppl": math.exp(heldout_nll), "heldout_nll": heldout_nll,
        "heldout_ppl_bf16": math.exp(heldout_nll_bf16),
        "chunk_len": args.eval_chunk, "dropped_tail": dropped_tail,
        "n_chunks": int(heldout_chunks.shape[0]), "n_predicted": n32,
        "samples": samples, "sample_top_k": args.sample_top_k,
        "sample_temperature": args.sample_temperature, "sample_max_new": args.sample_max_new,
    }
    with open(os.path.join(args.out, "training_log.json"), "w", encoding="utf-8") as f:
        json.dump({"validation": history, "train_loss_per_log_window": last_losses,
                   "log_every": args.log_every, "steps_per_epoch": steps_per_epoch}, f, indent=1)
        f.write("\n")
    write_card(args.out, info)  # once to measure the directory, then with its size
    info["dir_bytes"] = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out)
                            if os.path.isfile(os.path.join(args.out, f)))
    write_card(args.out, info)

    log("wrote " + ", ".join(f"{f} ({os.path.getsize(os.path.join(args.out, f)):,} B)"
                             for f in sorted(os.listdir(args.out))))
    log(f"done in {time.time() - T_START:.1f}s; held-out perplexity {math.exp(heldout_nll):.4f}")
    return 0


def _debian_version(corpus: str) -> str:
    try:
        with open(os.path.join(corpus, "manifest.json"), encoding="utf-8") as f:
            v = json.load(f)["debian_packages"]
        return ", ".join(f"{k} {val}" for k, val in sorted(v.items()))
    except Exception:  # noqa: BLE001
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
