#!/usr/bin/env python3
"""Prompt-lookup speculative decoding on a copy-heavy prompt set: acceptance
and end-to-end decode speed-up against plain decoding, one `kvgraph
generate` run per (prompt, mode), plain and speculative interleaved and
repeated (the median of the repeats counts, which keeps a busy machine's
noise out of the ratio).

The prompts: held-out fortunes (data/corpus/heldout.txt, never trained on),
each given once and then started again ("PASSAGE\\n%\\nFIRST WORDS"), the
"write it again" pattern prompt lookup is for. Greedy runs must print the
same ids with and without speculation (checked); sampled runs are reported
as they come (same distribution, other tokens).

  bench/spec_lookup.py [--bin build/cpu/kvgraph] [--device cpu] [--prompts 12]
                       [--repeats 3] [--max-tokens 128] [--ngram 3] [--k 4]
                       [--sampled] [--json OUT.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prompts(n):
    text = open(os.path.join(ROOT, "data", "corpus", "heldout.txt"), encoding="utf-8").read()
    fortunes = [f.strip("\n") for f in text.split("\n%\n")]
    picked = [f for f in fortunes if 200 <= len(f) <= 600][:n]
    return [f + "\n%\n" + " ".join(f.split(" ")[:4]) for f in picked]


def run(args, prompt, extra):
    cmd = [args.bin, "generate", "-q", "--json", "--device", args.device, "--max-tokens", str(args.max_tokens),
           "-p", prompt] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])} ... failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "cpu", "kvgraph"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ngram", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--sampled", action="store_true", help="temperature 0.8, top-k 40, top-p 0.95, seed 1")
    ap.add_argument("--json", help="write the per-prompt rows here")
    args = ap.parse_args()

    mode = ["--temperature", "0.8", "--seed", "1"] if args.sampled else ["--greedy"]
    spec = ["--lookup-ngram", str(args.ngram), "--draft-tokens", str(args.k)]
    rows = []
    for i, p in enumerate(prompts(args.prompts)):
        plain_ms, spec_ms = [], []
        for _ in range(args.repeats):
            a = run(args, p, mode)
            b = run(args, p, mode + spec)
            if not args.sampled and a["ids"] != b["ids"]:
                sys.exit(f"prompt {i}: greedy speculative ids differ from plain ones")
            plain_ms.append(a["decode_ms_per_token"])
            spec_ms.append(b["decode_ms_per_token"])
        s = b["speculative"]
        rows.append({"prompt": i, "prompt_tokens": len(a["prompt_ids"]), "tokens_plain": len(a["ids"]),
                     "tokens_spec": len(b["ids"]), "proposed": s["proposed"], "accepted": s["accepted"],
                     "verify_steps": s["verify_steps"], "plain_steps": s["plain_steps"],
                     "plain_ms_per_token": statistics.median(plain_ms),
                     "spec_ms_per_token": statistics.median(spec_ms)})
        r = rows[-1]
        print(f"prompt {i:2d}: {r['tokens_spec']:4d} tokens, acceptance {r['accepted']:4d}/{r['proposed']:<4d} "
              f"({100 * r['accepted'] / max(1, r['proposed']):5.1f}%), {r['verify_steps']} verify + "
              f"{r['plain_steps']} plain steps, {r['plain_ms_per_token']:.3f} -> {r['spec_ms_per_token']:.3f} ms/token "
              f"({r['plain_ms_per_token'] / r['spec_ms_per_token']:.2f}x)", flush=True)

    proposed = sum(r["proposed"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    # End to end: all decode time over all tokens, plain against speculative.
    t_plain = sum(r["plain_ms_per_token"] * max(1, r["tokens_plain"] - 1) for r in rows)
    t_spec = sum(r["spec_ms_per_token"] * max(1, r["tokens_spec"] - 1) for r in rows)
    n_plain = sum(max(1, r["tokens_plain"] - 1) for r in rows)
    n_spec = sum(max(1, r["tokens_spec"] - 1) for r in rows)
    steps = sum(r["verify_steps"] + r["plain_steps"] for r in rows)
    print(f"\n{args.device}, {'sampled' if args.sampled else 'greedy'}, prompt lookup n-gram {args.ngram}, K {args.k}, "
          f"{len(rows)} prompts x {args.repeats}: acceptance {accepted}/{proposed} = {100 * accepted / max(1, proposed):.1f}%, "
          f"{n_spec / max(1, steps):.2f} tokens a step; decode {t_plain / n_plain:.3f} -> {t_spec / n_spec:.3f} ms/token "
          f"= {(t_plain / n_plain) / (t_spec / n_spec):.2f}x")
    if args.json:
        json.dump({"device": args.device, "sampled": args.sampled, "ngram": args.ngram, "k": args.k, "rows": rows},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
