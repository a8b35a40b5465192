#!/usr/bin/env python3
"""Per-kernel profile of one eager decode step (or, with --prefill, of the prompt's prefill step) on the GPU machine (Nsight Compute).

Usage (repository root, GPU machine):
  python3 bench/profile_step.py synthetic:llama3.2-1b [--prompt 512] [--kvgraph build/cuda/kvgraph]

Runs `kvgraph bench --eager` under ncu (--clock-control none --cache-control none,
so kernels see the clocks and warm L2 they see in a real run), picks the last
complete decode step (from one embedding kernel to the next) and prints each
kernel's time and DRAM read bandwidth, then the sum per kernel kind. ncu
serialises kernels, so the sum excludes launch gaps: compare it with the step
time `kvgraph bench` measures with graph replay to see what the gaps cost.
"""
import argparse, csv, io, subprocess, sys, collections

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--prompt", type=int, default=512)
ap.add_argument("--kvgraph", default="build/cuda/kvgraph")
ap.add_argument("--ncu", default="ncu")
ap.add_argument("--raw", help="also write ncu's CSV here")
ap.add_argument("--prefill", action="store_true",
                help="profile the first prefill chunk (the whole prompt in one step) instead of a decode step")
ap.add_argument("--tune", default="", help="passed to kvgraph bench --tune")
ap.add_argument("--verify-tokens", type=int, default=0,
                help="profile the last speculative verify step of this many tokens instead of a decode step")
ap.add_argument("--bench-args", default="", help="more kvgraph bench flags, e.g. '--weights int4 --group-size 64'")
args = ap.parse_args()

cmd = [args.ncu, "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
       "--cache-control", "none", "--metrics", "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum",
       "-k", "regex:^(?!fill_kernel).*",
       args.kvgraph, "bench", "--device", "cuda", "--models", args.model, "--prompt", str(args.prompt),
       "--chunk", str(args.prompt), "--new-tokens", "5" if args.verify_tokens else "3", "--eager", "--quiet"]
if args.verify_tokens:
    cmd += ["--verify-tokens", str(args.verify_tokens)]
if args.tune:
    cmd += ["--tune", args.tune]
cmd += args.bench_args.split()
out = subprocess.run(cmd, capture_output=True, text=True)
if out.returncode != 0:
    sys.stderr.write(out.stderr[-4000:])
    sys.exit(out.returncode)
text = out.stdout
if args.raw:
    open(args.raw, "w").write(text)
start = text.find('"ID"')
rows = list(csv.DictReader(io.StringIO(text[start:])))
rows = [r for r in rows if r.get("ID", "").isdigit()]

def num(v):
    return float(v.replace(",", ""))

def short(name):
    name = name.split("(")[0]
    for p in ("void ", "kvgraph::cuda::", "<unnamed>::", "(anonymous namespace)::"):
        name = name.replace(p, "")
    return name[:48]

emb = [i for i, r in enumerate(rows) if "embedding" in r["Kernel Name"]]
if len(emb) < 3:
    sys.exit(f"found {len(emb)} embedding kernels; need a complete decode step")
def cells(r):  # "(512, 1, 1)" -> 512
    n = 1
    for v in r["Grid Size"].strip("()").split(","):
        n *= int(num(v))
    return n
if args.prefill:  # bench warms up with a short prefill first: the prompt's is the widest embedding launch
    k = max(range(len(emb) - 1), key=lambda j: cells(rows[emb[j]]))
    step = rows[emb[k]:emb[k + 1]]
elif args.verify_tokens:  # the verify steps run last: from the last embedding launch to the end
    step = rows[emb[-1]:]
else:
    step = rows[emb[-2]:emb[-1]]
total = 0.0
kinds = collections.OrderedDict()
what = ("the prefill step" if args.prefill else
        f"one eager verify step of {args.verify_tokens} tokens" if args.verify_tokens else "one eager decode step")
print(f"{args.model}: {len(step)} kernels in {what} (prompt {args.prompt})")
print(f"{'kernel':50s} {'grid':>16s} {'us':>8s} {'MB read':>9s} {'GB/s':>7s}")
for r in step:
    ns = num(r["gpu__time_duration.sum"])
    rd = num(r["dram__bytes_read.sum"])
    name = short(r["Kernel Name"])
    total += ns
    k = kinds.setdefault(name, [0, 0.0, 0.0])
    k[0] += 1; k[1] += ns; k[2] += rd
    print(f"{name:50s} {r['Grid Size']:>16s} {ns/1e3:8.2f} {rd/1e6:9.2f} {rd/ns if ns else 0:7.0f}")
print()
print(f"{'kind':50s} {'count':>6s} {'us':>9s} {'share':>6s} {'GB/s':>7s}")
for name, (n, ns, rd) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:50s} {n:6d} {ns/1e3:9.1f} {100*ns/total:5.1f}% {rd/ns:7.0f}")
print(f"{'sum of kernel times':50s} {len(step):6d} {total/1e3:9.1f}")
