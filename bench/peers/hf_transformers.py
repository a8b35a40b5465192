#!/usr/bin/env python3
"""Peer benchmark: Hugging Face transformers, batch-1 greedy decode on the GPU.

For each model shape (published config values, embedded below: no downloads),
builds a model with random bf16 weights on the GPU, feeds a prompt of random
token ids, and decodes new tokens greedily with a static KV cache and
torch.compile (mode "reduce-overhead", i.e. CUDA graphs). Prints one JSON line
per shape.

Modes
  generate (default): model.generate() with generation_config.cache_implementation
      = "static". transformers >= 4.50 / v5 compiles the decode forward itself
      when the cache is static ("auto-compile", configured by compile_config);
      --compile forward instead disables that and wraps model.forward in
      torch.compile(mode="reduce-overhead", fullgraph=True), the older recipe.
      Timing: a streamer records the host time each new token arrives (generate
      copies each token to the host, so each interval ends with a sync);
      ms_per_token is the MEDIAN of the intervals between consecutive new
      tokens (tokens 2..N: decode steps only, prefill excluded), over the timed
      runs; ms_per_token_mean is their mean.
  loop: a hand-written decode loop over a StaticCache with a torch.compile'd
      one-token step (the "custom generation loop" recipe of the transformers
      docs); no host sync per token. Timing: CUDA events between steps;
      ms_per_token is the median step time.

Usage
  python3 bench/peers/hf_transformers.py --shapes llama3.2-1b,llama3.1-8b \
      --prompt 512 --new-tokens 256 [--mode generate|loop] [--runs 3]
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback

# Published config.json values (the fields that set shapes and attention).
SHAPES = {
    # Qwen/Qwen2.5-0.5B
    "qwen2.5-0.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        hidden_act="silu", use_sliding_window=False,
        rope={"rope_type": "default", "rope_theta": 1000000.0}),
    # meta-llama/Llama-3.2-1B
    "llama3.2-1b": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
        rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # meta-llama/Llama-3.1-8B
    "llama3.1-8b": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
        rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # mistralai/Mistral-7B-v0.1 (sliding_window 4096 exceeds the benchmark's context)
    "mistral-7b": dict(
        model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=32768, rms_norm_eps=1e-5, tie_word_embeddings=False,
        hidden_act="silu", sliding_window=4096,
        rope={"rope_type": "default", "rope_theta": 10000.0}),
    # google/gemma-3-1b-pt (gemma3_text): 5 sliding (512) layers per full one
    "gemma3-1b": dict(
        model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
        num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, sliding_window=512,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)],
        attn_logit_softcapping=None, final_logit_softcapping=None,
        rope={"rope_type": "default", "rope_theta": 1000000.0},
        rope_local={"rope_type": "default", "rope_theta": 10000.0}),
}


def make_config(spec: dict):
    """A transformers config from the spec, trying the v5 RoPE layout first."""
    from transformers import AutoConfig

    kw = dict(spec)
    model_type = kw.pop("model_type")
    rope = kw.pop("rope")
    rope_local = kw.pop("rope_local", None)
    attempts = []
    # transformers v5: rope_parameters (per layer type for Gemma 3).
    v5 = {"full_attention": rope, "sliding_attention": rope_local} if rope_local else rope
    attempts.append({"rope_parameters": v5})
    # transformers v4: rope_theta / rope_scaling / rope_local_base_freq.
    legacy = {"rope_theta": rope["rope_theta"]}
    if rope["rope_type"] != "default":
        legacy["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if rope_local:
        legacy["rope_local_base_freq"] = rope_local["rope_theta"]
    attempts.append(legacy)
    attempts.append({})  # RoPE values do not change decode speed: defaults as a last resort
    errors = []
    for extra in attempts:
        try:
            return AutoConfig.for_model(model_type, **kw, **extra)
        except Exception as e:  # noqa: BLE001 - try the next layout
            errors.append(f"{type(e).__name__}: {e}")
    raise RuntimeError(f"cannot build a {model_type} config: " + " | ".join(errors))


def layer_windows(cfg) -> list[int]:
    """Per layer: 0 for full attention, else the sliding window."""
    n = cfg.num_hidden_layers
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None) or 0
    if types:
        return [window if t in ("sliding_attention", "chunked_attention") else 0 for t in types]
    return [0] * n


def byte_counts(model, cfg, prompt: int, new_tokens: int) -> dict:
    """Weight bytes (unique parameters) and KV bytes, bf16."""
    seen, weight_bytes = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        weight_bytes += p.numel() * p.element_size()
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings() is not None and \
        model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
    # A decode step reads every weight once, except an untied input embedding
    # table, of which it reads one row.
    read = weight_bytes if tied else weight_bytes - emb.numel() * emb.element_size() + emb.shape[1] * emb.element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_layer = 2 * cfg.num_key_value_heads * head_dim * 2  # K and V, bf16, one position
    windows = layer_windows(cfg)
    kv_per_token = per_layer * cfg.num_hidden_layers
    # Mean KV bytes read per decode step (keys visible to the new token).
    total = 0
    for i in range(new_tokens):
        ctx = prompt + i + 1
        total += sum(per_layer * (min(ctx, w) if w else ctx) for w in windows)
    return dict(weight_bytes=weight_bytes, weight_bytes_read_per_token=read, kv_bytes_per_token=kv_per_token,
                kv_bytes_read_mean=total // max(new_tokens, 1), tied_embeddings=bool(tied))


class Clock:
    """A generate() streamer that records when each new token reaches the host."""

    def __init__(self):
        self.times = []

    def put(self, value):  # first call: the prompt; then one call per new token
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run_generate(model, torch, prompt_ids, new_tokens: int, runs: int, compile_mode: str) -> dict:
    gc_ = model.generation_config
    gc_.cache_implementation = "static"
    gc_.do_sample = False
    gc_.max_new_tokens = new_tokens
    gc_.min_new_tokens = new_tokens
    gc_.eos_token_id = None
    gc_.pad_token_id = 0
    gc_.temperature = None
    gc_.top_p = None
    gc_.top_k = None
    if compile_mode == "forward":
        gc_.disable_compile = True
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    else:
        try:
            from transformers import CompileConfig
            gc_.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
        except ImportError:
            pass
    mask = torch.ones_like(prompt_ids)
    # Warm-up: compilation and CUDA-graph recording (reduce-overhead records
    # after a few calls).
    for _ in range(2):
        model.generate(input_ids=prompt_ids, attention_mask=mask)
    torch.cuda.synchronize()
    intervals, totals = [], []
    for _ in range(runs):
        clock = Clock()
        t0 = time.perf_counter()
        out = model.generate(input_ids=prompt_ids, attention_mask=mask, streamer=clock)
        torch.cuda.synchronize()
        totals.append(time.perf_counter() - t0)
        assert out.shape[1] == prompt_ids.shape[1] + new_tokens, out.shape
        t = clock.times
        # t[0]: prompt; t[1]: first new token (prefill); t[2:]: decode steps.
        intervals += [(b - a) * 1e3 for a, b in zip(t[1:-1], t[2:])]
    return dict(ms_per_token=statistics.median(intervals), ms_per_token_mean=statistics.fmean(intervals),
                generate_total_s=statistics.median(totals),
                timing="median of host intervals between consecutive new tokens (decode only), "
                       f"{runs} runs of {new_tokens} tokens")


def make_static_cache(model, torch, max_len: int):
    from transformers import StaticCache
    try:  # transformers v5
        return StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:  # v4
        return StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len, device=model.device,
                           dtype=model.dtype)


def run_loop(model, torch, prompt_ids, new_tokens: int, runs: int) -> dict:
    P = prompt_ids.shape[1]
    cache = make_static_cache(model, torch, P + new_tokens + 8)
    positions = torch.arange(P, P + new_tokens, device=prompt_ids.device)

    def decode_one(tok, pos):
        logits = model(input_ids=tok, position_ids=pos[None], cache_position=pos, past_key_values=cache,
                       use_cache=True).logits
        return logits[:, -1].argmax(dim=-1, keepdim=True)

    step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)

    def one_run(timed: bool):
        cache.reset()
        logits = model(input_ids=prompt_ids, cache_position=torch.arange(P, device=prompt_ids.device),
                       past_key_values=cache, use_cache=True).logits
        tok = logits[:, -1].argmax(dim=-1, keepdim=True)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(new_tokens + 1)] if timed else None
        if timed:
            events[0].record()
        for i in range(new_tokens):
            tok = step(tok, positions[i:i + 1]).clone()
            if timed:
                events[i + 1].record()
        torch.cuda.synchronize()
        return [events[i].elapsed_time(events[i + 1]) for i in range(new_tokens)] if timed else None

    for _ in range(3):
        one_run(False)
    times = []
    for _ in range(runs):
        times += one_run(True)[1:]  # the first step may still pay for graph replay setup
    return dict(ms_per_token=statistics.median(times), ms_per_token_mean=statistics.fmean(times),
                timing=f"median of CUDA-event step times, {runs} runs of {new_tokens} tokens, no host sync per token")


def bench_shape(name: str, args) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    cfg = make_config(SHAPES[name])
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    counts = byte_counts(model, cfg, args.prompt, args.new_tokens)
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt_ids = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=gen).to("cuda")
    with torch.inference_mode():
        if args.mode == "loop":
            timing = run_loop(model, torch, prompt_ids, args.new_tokens, args.runs)
        else:
            timing = run_generate(model, torch, prompt_ids, args.new_tokens, args.runs, args.compile)
    result = dict(peer="hf_transformers", shape=name, mode=args.mode,
                  compile=args.compile if args.mode == "generate" else "decode step",
                  prompt=args.prompt, new_tokens=args.new_tokens, **timing, **counts,
                  params=sum(p.numel() for p in model.parameters()),
                  attn_implementation=getattr(model.config, "_attn_implementation", None),
                  device=torch.cuda.get_device_name(), torch=torch.__version__,
                  transformers=transformers.__version__)
    if args.bandwidth_gbs > 0:
        floor_ms = (counts["weight_bytes_read_per_token"] + counts["kv_bytes_read_mean"]) / (args.bandwidth_gbs * 1e9) * 1e3
        result.update(floor_bandwidth_gbs=args.bandwidth_gbs, floor_ms=floor_ms,
                      fraction_of_floor=floor_ms / result["ms_per_token"])
    del model
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--prompt", type=int, default=512, help="prompt length (random ids)")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--mode", choices=["generate", "loop"], default="generate")
    ap.add_argument("--compile", choices=["auto", "forward"], default="auto",
                    help="generate mode: transformers' own compile of the decode step (auto) or "
                         "model.forward = torch.compile(...) (forward)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs after warm-up")
    ap.add_argument("--bandwidth-gbs", type=float, default=4200.0,
                    help="bandwidth for the floor estimate (0: omit); 4200 = the H200 copy figure in PERF.md")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"peer": "hf_transformers", "error": "no CUDA device"}))
        return 1
    status = 0
    for name in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        if name not in SHAPES:
            print(json.dumps({"peer": "hf_transformers", "shape": name, "error": "unknown shape"}), flush=True)
            status = 1
            continue
        try:
            print(json.dumps(bench_shape(name, args)), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on with the next shape
            traceback.print_exc(file=sys.stderr)
            print(json.dumps({"peer": "hf_transformers", "shape": name, "error": f"{type(e).__name__}: {e}"}),
                  flush=True)
            status = 1
        gc.collect()
        torch.cuda.empty_cache()
        torch._dynamo.reset()
    return status


if __name__ == "__main__":
    sys.exit(main())
