#!/usr/bin/env python3
"""Quality of quantized KV caches (issue 15) on the trained default model, CPU.

For each KV format: held-out perplexity (`kvgraph perplexity ... --kv-dtype X`,
the windows of bench/results/quant-perplexity-cpu.md) and greedy agreement with
bf16 KV: N prompts (the first line of the first N held-out entries), 256 greedy
tokens each (--ignore-eos), compared token by token with the bf16-KV run
(the tokens before the first difference, and prompts that agree throughout);
and the same continuations teacher-forced (`kvgraph score` of bf16's prompt +
256 tokens, every format): the share of the 256 positions whose arg-max
equals the arg-max of bf16 KV scored the same way.
Prints a markdown table; the raw figures go to OUT (JSON). --from reuses the
perplexities and greedy runs of an earlier OUT.

  bench/kv_quant_quality.py [--kvgraph build/cpu/kvgraph] [--prompts 16] [--out /tmp/kv_quant_quality.json] [--from OLD.json]
"""
import argparse
import json
import subprocess
import sys

FORMATS = [  # (label, flags)
    ("f32", ["--kv-dtype", "f32"]),
    ("bf16", ["--kv-dtype", "bf16"]),
    ("f16", ["--kv-dtype", "f16"]),
    ("int8 g64", ["--kv-dtype", "int8", "--kv-group", "64"]),
    ("int8 g32", ["--kv-dtype", "int8", "--kv-group", "32"]),
    ("fp8", ["--kv-dtype", "fp8"]),
    ("int4 g64", ["--kv-dtype", "int4", "--kv-group", "64"]),
    ("int4 g32", ["--kv-dtype", "int4", "--kv-group", "32"]),
    ("k int8, v int4 (g64)", ["--k-dtype", "int8", "--v-dtype", "int4", "--kv-group", "64"]),
]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvgraph", default="build/cpu/kvgraph")
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--text", default="data/corpus/heldout.txt")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", default="/tmp/kv_quant_quality.json")
    ap.add_argument("--from", dest="reuse", default=None)
    a = ap.parse_args()
    old = json.load(open(a.reuse)) if a.reuse else {}

    entries = [e.strip() for e in open(a.text).read().split("\n%\n") if e.strip()]
    prompts = [e.splitlines()[0] for e in entries[: a.prompts]]
    base = ["-m", a.model, "-q"]
    results = {}
    for label, flags in FORMATS:
        if label in old:
            results[label] = old[label]
            continue
        ppl = run([a.kvgraph, "perplexity", a.text, "--separator", "%", "--ctx", "256", "--json"] + base + flags)
        gens = [run([a.kvgraph, "generate", "-p", p, "--greedy", "--ignore-eos", "--max-tokens", str(a.tokens), "--json"]
                    + base + flags) for p in prompts]
        results[label] = {"perplexity": ppl["perplexity"], "mean_nll": ppl["mean_nll"], "tokens_scored": ppl["tokens_scored"],
                          "greedy": [g["ids"] for g in gens], "prompt_ids": [g["prompt_ids"] for g in gens]}
        print(f"{label}: perplexity {ppl['perplexity']:.4f}", file=sys.stderr, flush=True)
    # Teacher-forced: every format scores bf16's prompt + continuation.
    ref = results["bf16"]
    if "prompt_ids" not in ref:
        ref["prompt_ids"] = [run([a.kvgraph, "generate", "-p", p, "--greedy", "--max-tokens", "1", "--json"] + base)["prompt_ids"]
                             for p in prompts]
    ids_file = a.out + ".ids"
    argmax = {}
    for label, flags in FORMATS:
        argmax[label] = []
        for pid, cont in zip(ref["prompt_ids"], ref["greedy"]):
            open(ids_file, "w").write(" ".join(map(str, pid + cont)))
            am = run([a.kvgraph, "score", "--ids", ids_file] + base + flags)["argmax"]
            # position i predicts token i + 1: the continuation is predicted from len(pid) - 1 on
            argmax[label].append(am[len(pid) - 1:len(pid) - 1 + len(cont)])
    for label, _ in FORMATS:
        results[label]["teacher_forced_top1"] = [
            sum(1 for x, y in zip(am, bm) if x == y) / len(bm) for am, bm in zip(argmax[label], argmax["bf16"])]
    json.dump(results, open(a.out, "w"))

    ref = results["bf16"]
    print(f"| KV | perplexity | mean NLL | vs bf16 KV | greedy: tokens before the first difference (mean of {len(prompts)}) "
          f"| prompts identical for {a.tokens} | teacher-forced top-1 = bf16's |")
    print("|---|---|---|---|---|---|---|")
    for label, _ in FORMATS:
        r = results[label]
        same = []
        for g, b in zip(r["greedy"], ref["greedy"]):
            n = 0
            while n < min(len(g), len(b)) and g[n] == b[n]:
                n += 1
            same.append(n)
        full = sum(1 for n, b in zip(same, ref["greedy"]) if n == len(b))
        tf = r["teacher_forced_top1"]
        print(f"| {label} | {r['perplexity']:.4f} | {r['mean_nll']:.5f} | {100 * (r['perplexity'] / ref['perplexity'] - 1):+.2f}% "
              f"| {sum(same) / len(same):.1f} | {full} / {len(same)} | {100 * sum(tf) / len(tf):.2f}% |")


if __name__ == "__main__":
    main()
