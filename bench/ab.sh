#!/usr/bin/env bash
# A/B of kvgraph binaries (builds of two trees, or of one tree with a
# kernel variant) in one device call: every configuration runs on every
# binary, interleaved (a, b, a, b ...) so drift in clocks or temperature
# falls on both, and the summary gives each binary's median decode time and
# its ratio to the first binary's.
#   BINS="build/cuda/kvgraph_base build/cuda/kvgraph" bench/ab.sh [CONFIG ...]
# Each CONFIG is one string of extra `kvgraph bench` arguments ("" or "-"
# for none). Environment:
#   BINS   binaries, the first is the baseline (default build/cuda/kvgraph)
#   REPS   runs of each (binary, config) (default 2)
#   ARGS   arguments every run shares (default: the two issue-13 shapes,
#          int4 g64 weights, prompt 512, 128 new tokens)
#   OUT    where ab.jsonl (every row, tagged with its binary and config) goes
#          (default /tmp)
#   NCU_KERNEL  a kernel name regex (e.g. decode_kernel): also profile one
#          eager decode step of each binary with bench/profile_step.py
#          (Nsight Compute, kernels serialised: their own time apart from
#          overlap and placement) on NCU_MODEL (default synthetic:llama3.1-8b)
#          under ARGS' weights flags and the first CONFIG, and print the
#          matching kernel kinds' count, time and share of the step (the
#          whole profile goes to OUT/ab_profile_BINARY.txt).
# Exit status: non-zero when a run fails (its error is printed).
set -uo pipefail
BINS=${BINS:-build/cuda/kvgraph}
REPS=${REPS:-2}
ARGS=${ARGS:---device cuda --models synthetic:llama3.1-8b,synthetic:llama3.2-1b --new-tokens 128 --weights int4 --group-size 64}
OUT=${OUT:-/tmp}
[ $# -eq 0 ] && set -- -
rows="$OUT/ab.jsonl"
: > "$rows"
status=0
for config in "$@"; do
  [ "$config" = - ] && config=""
  for ((rep = 0; rep < REPS; ++rep)); do
    for bin in $BINS; do
      # shellcheck disable=SC2086  # ARGS and config are argument lists
      if ! out=$(timeout 300 "$bin" bench $ARGS $config --json 2>&1); then
        echo "[ab] $bin $config: failed" >&2
        printf '%s\n' "$out" | tail -3 >&2
        status=1
        continue
      fi
      printf '%s\n' "$out" | grep '^{' | python3 -c '
import json, sys
for line in sys.stdin:
    row = json.loads(line)
    row["ab_bin"], row["ab_config"] = sys.argv[1], sys.argv[2]
    print(json.dumps(row))' "$bin" "$config" >> "$rows"
    done
  done
done
# shellcheck disable=SC2086  # BINS is a list
python3 - "$rows" $BINS <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bins = sys.argv[2:]
def key(r):
    return (r["ab_config"], r["model"], r.get("weights", ""), r.get("kv_dtype", ""))
keys = list(dict.fromkeys(key(r) for r in rows))
print(f"{'config / model':60s}" + "".join(f"{b.split('/')[-1][:18]:>20s}" for b in bins))
for k in keys:
    med = []
    for b in bins:
        t = [r["decode_ms_median"] for r in rows if key(r) == k and r["ab_bin"] == b]
        med.append(statistics.median(t) if t else None)
    label = f"{k[0] or '(default)'} | {k[1]} {k[2]} kv {k[3]}"
    cells = []
    for m in med:
        if m is None:
            cells.append(f"{'-':>20s}")
        elif med[0]:
            cells.append(f"{m:9.3f} ms {m / med[0]:6.3f}x")
        else:
            cells.append(f"{m:9.3f} ms {'':7s}")
    print(f"{label[:60]:60s}" + "".join(f"{c:>20s}" for c in cells))
PY
if [ -n "${NCU_KERNEL:-}" ]; then
  first=$1
  [ "$first" = - ] && first=""
  # the weights flags of ARGS (not its models or token counts)
  wflags=$(printf '%s\n' "$ARGS" | grep -oE -- '--(weights|group-size|kv-dtype) [^ ]+' | tr '\n' ' ')
  for bin in $BINS; do
    prof="$OUT/ab_profile_$(basename "$bin").txt"
    if ! python3 "$(dirname "$0")/profile_step.py" "${NCU_MODEL:-synthetic:llama3.1-8b}" --kvgraph "$bin" \
        --bench-args "$wflags $first" > "$prof" 2>&1; then
      echo "[ab] profile of $bin failed (see $prof)" >&2
      status=1
      continue
    fi
    echo "$bin (ncu, one eager decode step):"
    grep -E "($NCU_KERNEL).*%|^sum of kernel times" "$prof"
  done
fi
exit $status
