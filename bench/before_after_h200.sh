#!/usr/bin/env bash
# Before/after decode timings in one device call: builds the kvgraph binary of
# a baseline source tree (default ./baseline, e.g. `git archive <rev>`) and of
# this tree, then runs `kvgraph bench --json` on the five synthetic shapes,
# alternating baseline and current, RUNS times each. JSON lines go to
# $OUT/before.jsonl and $OUT/after.jsonl; a table of medians is printed last.
#   bench/before_after_h200.sh [baseline dir] [runs]
set -uo pipefail
BASE=${1:-baseline}
RUNS=${2:-3}
OUT=${OUT:-/tmp}
MODELS=synthetic:qwen2.5-0.5b,synthetic:llama3.2-1b,synthetic:llama3.1-8b,synthetic:gemma3-1b,synthetic:mistral-7b
build() {  # $1 source dir, $2 build dir, targets...
  local src=$1 dir=$2; shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGRAPH_CUDA=ON -DKVGRAPH_TESTS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/cmake_$(basename "$dir").log" 2>&1 &&
    cmake --build "$dir" --target "$@" > "$OUT/build_$(basename "$dir").log" 2>&1
}
if [ ! -x "$BASE/build-h200/kvgraph" ]; then build "$BASE" "$BASE/build-h200" kvgraph & fi
wait
[ -x "$BASE/build-h200/kvgraph" ] || { echo "baseline build failed"; tail -20 "$OUT/build_build-h200.log"; exit 1; }
: > "$OUT/before.jsonl"; : > "$OUT/after.jsonl"
for i in $(seq "$RUNS"); do
  "$BASE/build-h200/kvgraph" bench --device cuda --quiet --json --models "$MODELS" >> "$OUT/before.jsonl" 2> "$OUT/before_err.txt"
  build/cuda/kvgraph bench --device cuda --quiet --json --models "$MODELS" >> "$OUT/after.jsonl" 2> "$OUT/after_err.txt"
done
python3 - "$OUT/before.jsonl" "$OUT/after.jsonl" <<'PY'
import json, statistics, sys
def load(p):
    rows = {}
    for line in open(p):
        if line.startswith('{'):
            j = json.loads(line); rows.setdefault(j['model'], []).append(j['decode_ms_median'])
    return rows
b, a = load(sys.argv[1]), load(sys.argv[2])
print(f"{'shape':<28} {'before ms (runs)':<30} {'after ms (runs)':<30} {'after/before':>12}")
for m in b:
    mb, ma = statistics.median(b[m]), statistics.median(a.get(m, [float('nan')]))
    fmt = lambda v: ' '.join(f'{x:.3f}' for x in v)
    print(f"{m:<28} {mb:.3f} ({fmt(b[m])}){'':<4} {ma:.3f} ({fmt(a.get(m, []))}){'':<4} {ma / mb:>11.3f}x")
PY
