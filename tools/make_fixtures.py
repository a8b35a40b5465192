#!/usr/bin/env python3
"""Make the tiny reference checkpoints kvgraph's model tests compare against.

For each family (llama, qwen2, mistral, gemma2, gemma3, qwen3) this builds a
random-weight model with transformers (fixed seed, float32, eager attention),
saves it with save_pretrained (config.json + model.safetensors), reloads it
from disk (so the references come from exactly what kvgraph will read), and
writes next to it:

  logits.bin      float32 little-endian, row-major [SEQ_LEN, vocab]: the
                  logits at every position of one forward pass over `ids`.
  reference.json  {"ids": [SEQ_LEN ids], "vocab": V,
                   "greedy_prompt": [first PROMPT_LEN ids],
                   "greedy": [GEN_LEN greedy ids, EOS logits masked to -inf
                              at every step, as kvgraph's --ignore-eos does],
                   "eos": [...], "transformers": ver, "torch": ver, ...}

The weights are redrawn after init with unit-scale statistics and the q/k
projections (or the q/k norms, for models that normalise q and k) scaled up,
so attention is sharp rather than uniform and argmaxes are well separated.

Usage (offline; needs torch and transformers 5.x):
    python3 tools/make_fixtures.py --out tests/fixtures/models
"""

from __future__ import annotations

import argparse
import array
import inspect
import json
import math
import sys
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

SEQ_LEN = 128
PROMPT_LEN = 16
GEN_LEN = 32
VOCAB = 256
FIRST_ID = 4  # random ids start here, clear of pad/bos/eos

# Shared shape: hidden 64, 4 query heads over 2 kv heads (GQA), head_dim 16
# unless a family overrides it.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    attn_implementation="eager",
)


def family_configs():
    """name -> (config, seed). Each exercises its family's distinctive options."""
    return {
        # Llama 3.x: llama3 RoPE scaling (original_max_position_embeddings 64
        # puts inv_freq in all three bands: kept, smoothed, divided by factor),
        # biases on q/k/v/o and on the MLP, eps 1e-5.
        "llama": (
            LlamaConfig(
                **COMMON,
                num_hidden_layers=3,
                head_dim=16,
                rms_norm_eps=1e-5,
                attention_bias=True,
                mlp_bias=True,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            ),
            1001,
        ),
        # Qwen2: q/k/v bias; sliding window on layers >= max_window_layers.
        "qwen2": (
            Qwen2Config(
                **COMMON,
                num_hidden_layers=4,
                use_sliding_window=True,
                sliding_window=12,
                max_window_layers=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                bos_token_id=1,
                eos_token_id=[2, 3],
                pad_token_id=0,
            ),
            1002,
        ),
        # Mistral: every layer slides with window 16.
        "mistral": (
            MistralConfig(
                **COMMON,
                num_hidden_layers=3,
                head_dim=16,
                sliding_window=16,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            ),
            1003,
        ),
        # Gemma 2: alternating sliding (even layers) / global, both soft-caps
        # low enough to bite, head_dim 32 != hidden / heads, and
        # query_pre_attn_scalar (24) != head_dim.
        "gemma2": (
            Gemma2Config(
                **{**COMMON, "tie_word_embeddings": True},
                num_hidden_layers=4,
                head_dim=32,
                query_pre_attn_scalar=24,
                sliding_window=8,
                attn_logit_softcapping=8.0,
                final_logit_softcapping=10.0,
                hidden_activation="gelu_pytorch_tanh",
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                bos_token_id=2,
                eos_token_id=1,
                pad_token_id=0,
            ),
            1004,
        ),
        # Gemma 3 (text): q/k norms, sliding + global layers with different
        # RoPE (local theta 1e4 default; global theta 1e6 with linear scaling
        # x2), final soft-cap, head_dim 32, query_pre_attn_scalar 48.
        "gemma3": (
            Gemma3TextConfig(
                **{**COMMON, "tie_word_embeddings": True},
                num_hidden_layers=4,
                head_dim=32,
                query_pre_attn_scalar=48,
                sliding_window=12,
                layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
                final_logit_softcapping=15.0,
                attn_logit_softcapping=None,
                hidden_activation="gelu_pytorch_tanh",
                bos_token_id=2,
                eos_token_id=1,
                pad_token_id=0,
            ),
            1005,
        ),
        # Qwen3: q/k norms, explicit head_dim (its default is 128), tied embeddings.
        "qwen3": (
            Qwen3Config(
                **{**COMMON, "tie_word_embeddings": True},
                num_hidden_layers=3,
                head_dim=16,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            ),
            1006,
        ),
    }


def eos_list(cfg) -> list[int]:
    eos = getattr(cfg, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def norm_plus_one(cfg) -> bool:
    return cfg.model_type.startswith("gemma")


def has_qk_norm(model) -> bool:
    return any(".q_norm." in n for n, _ in model.named_parameters())


@torch.no_grad()
def redraw_weights(model, cfg, seed: int) -> None:
    """Unit-scale random weights, deterministic from `seed`, with sharp attention."""
    g = torch.Generator().manual_seed(seed)
    plus_one = norm_plus_one(cfg)
    qk_norm = has_qk_norm(model)

    def normal(p, mean, std):
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std + mean)

    for name, p in model.named_parameters():  # tied weights appear once
        if name.endswith(".bias"):
            normal(p, 0.0, 0.2)
        elif p.dim() == 1:  # RMSNorm weights
            sharpen = ".q_norm." in name or ".k_norm." in name
            if plus_one:  # Gemma multiplies by (1 + w)
                normal(p, 1.0 if sharpen else 0.0, 0.1)
            else:
                normal(p, 2.0 if sharpen else 1.0, 0.1)
        elif "embed_tokens" in name or "lm_head" in name:
            normal(p, 0.0, 1.0)
        elif p.dim() == 2:  # nn.Linear [out, in]
            normal(p, 0.0, p.shape[1] ** -0.5)
            if not qk_norm and (".q_proj." in name or ".k_proj." in name):
                p.mul_(2.0)  # logits = q.k * scale: x4 -> std ~4, sharp softmax
        else:
            raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")

    # Tied checkpoints store only the embedding; make sure lm_head is that tensor.
    if getattr(cfg, "tie_word_embeddings", False):
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out.weight is not inp.weight:
            out.weight.copy_(inp.weight)


def build_model(cfg):
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_config(cfg)
    if getattr(model.config, "_attn_implementation", None) != "eager" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    return model.to(torch.float32).eval()


def save(model, out_dir: Path) -> None:
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers 4.x; always safetensors in 5.x
    model.save_pretrained(str(out_dir), **kwargs)
    if not (out_dir / "model.safetensors").exists():
        raise RuntimeError(f"{out_dir}: save_pretrained wrote no model.safetensors: {sorted(p.name for p in out_dir.iterdir())}")


def load(out_dir: Path):
    try:
        model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(
            str(out_dir), torch_dtype=torch.float32, attn_implementation="eager"
        )
    return model.eval()


def top2_gap(row: torch.Tensor) -> float:
    v = row.topk(2).values
    return float(v[0] - v[1])


@torch.no_grad()
def manual_greedy(model, prompt: torch.Tensor, n: int, eos: list[int]) -> tuple[list[int], float]:
    """Greedy by full forward passes (no cache), EOS masked; also the smallest top-2 gap."""
    ids = prompt.clone()
    out, min_gap = [], math.inf
    for _ in range(n):
        row = model(input_ids=ids[None]).logits[0, -1].float().clone()
        if eos:
            row[eos] = -math.inf
        min_gap = min(min_gap, top2_gap(row))
        nxt = int(row.argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([nxt], dtype=ids.dtype)])
    return out, min_gap


@torch.no_grad()
def reference_greedy(model, prompt: torch.Tensor, n: int, eos: list[int]) -> list[int]:
    kwargs = dict(
        input_ids=prompt[None],
        attention_mask=torch.ones_like(prompt)[None],
        do_sample=False,
        num_beams=1,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=0,
        use_cache=True,
    )
    if eos:
        # EOS can never be picked: exactly kvgraph's --ignore-eos (logit -> -inf).
        kwargs["eos_token_id"] = eos
        kwargs["suppress_tokens"] = eos
    out = model.generate(**kwargs)
    seq = out.sequences if hasattr(out, "sequences") else out
    gen = [int(t) for t in seq[0, prompt.numel():]]
    if len(gen) != n:
        raise RuntimeError(f"generate returned {len(gen)} tokens, expected {n}")
    return gen


def write_f32(path: Path, t: torch.Tensor) -> None:
    a = array.array("f", t.detach().to(torch.float32).cpu().contiguous().flatten().tolist())
    if sys.byteorder != "little":
        a.byteswap()
    with open(path, "wb") as f:
        a.tofile(f)


def inv_freq_buffers(model) -> dict[str, list[float]]:
    return {
        name: [float(x) for x in buf.float().flatten()]
        for name, buf in model.named_buffers()
        if name.endswith("inv_freq")
    }


def make_family(name: str, cfg, seed: int, root: Path) -> None:
    out_dir = root / name
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("model.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json"):
        (out_dir / stale).unlink(missing_ok=True)

    torch.manual_seed(seed)
    model = build_model(cfg)
    redraw_weights(model, cfg, seed)
    save(model, out_dir)

    # References come from the model as reloaded from disk.
    reloaded = load(out_dir)
    if reloaded.config._attn_implementation != "eager":
        raise RuntimeError(f"{name}: reloaded model uses {reloaded.config._attn_implementation}, not eager")
    eos = eos_list(reloaded.config)
    vocab = int(reloaded.config.vocab_size)

    g = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(FIRST_ID, vocab, (SEQ_LEN,), generator=g, dtype=torch.long)

    with torch.no_grad():
        logits = reloaded(input_ids=ids[None]).logits[0].float()
        original = model(input_ids=ids[None]).logits[0].float()
    if logits.shape != (SEQ_LEN, vocab):
        raise RuntimeError(f"{name}: logits shape {tuple(logits.shape)}")
    if not torch.isfinite(logits).all():
        raise RuntimeError(f"{name}: non-finite logits")
    if not torch.allclose(logits, original, rtol=0, atol=1e-4):
        raise RuntimeError(
            f"{name}: reloaded model differs from the saved one (max |diff| "
            f"{float((logits - original).abs().max()):.3g}); config.json does not round-trip"
        )
    min_row_gap = min(top2_gap(r) for r in logits)

    prompt = ids[:PROMPT_LEN]
    greedy = reference_greedy(reloaded, prompt, GEN_LEN, eos)
    manual, greedy_gap = manual_greedy(reloaded, prompt, GEN_LEN, eos)
    if manual != greedy:
        print(f"WARNING {name}: generate() and full-forward greedy disagree:\n  {greedy}\n  {manual}", file=sys.stderr)

    write_f32(out_dir / "logits.bin", logits)
    ref = {
        "family": name,
        "model_type": reloaded.config.model_type,
        "architectures": list(getattr(reloaded.config, "architectures", None) or []),
        "seq_len": SEQ_LEN,
        "vocab": vocab,
        "ids": [int(t) for t in ids],
        "logits_file": "logits.bin",
        "logits_dtype": "float32-le",
        "logits_shape": [SEQ_LEN, vocab],
        "greedy_prompt": [int(t) for t in prompt],
        "greedy": greedy,
        "greedy_eos_masked": True,
        "greedy_matches_full_forward": manual == greedy,
        "eos": eos,
        "min_top2_gap_logits": min_row_gap,
        "min_top2_gap_greedy": greedy_gap,
        "logits_abs_max": float(logits.abs().max()),
        "rope_inv_freq": inv_freq_buffers(reloaded),
        "seed": seed,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    with open(out_dir / "reference.json", "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")

    nparams = sum(p.numel() for p in reloaded.parameters())
    size = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file())
    print(f"---- {name}/config.json ----")
    print((out_dir / "config.json").read_text().rstrip())
    print(
        f"{name}: {type(reloaded).__name__} params={nparams} files={size / 1e6:.2f}MB "
        f"|logits|max={ref['logits_abs_max']:.2f} min_gap(logits)={min_row_gap:.4f} "
        f"min_gap(greedy)={greedy_gap:.4f} greedy_ok={manual == greedy} eos={eos} "
        f"greedy[:8]={greedy[:8]}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output root, e.g. tests/fixtures/models")
    ap.add_argument("--only", nargs="*", default=None, help="subset of families")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    configs = family_configs()
    names = args.only or list(configs)
    for n in names:
        if n not in configs:
            ap.error(f"unknown family {n!r} (have {', '.join(configs)})")
    args.out.mkdir(parents=True, exist_ok=True)
    for n in names:
        cfg, seed = configs[n]
        make_family(n, cfg, seed, args.out)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"total {total / 1e6:.2f}MB in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
