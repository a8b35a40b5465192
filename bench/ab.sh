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
keys = []
for r in rows:
    k = (r["ab_config"], r["model"], r.get("weights", ""), r.get("kv_dtype", ""))
    if k not in keys:
        keys.append(k)
print(f"{'config / model':60s}" + "".join(f"{b.split('/')[-1][:18]:>20s}" for b in bins))
for k in keys:
    med = []
    for b in bins:
        t = [r["decode_ms_median"] for r in rows
             if (r["ab_config"], r["model"], r.get("weights", ""), r.get("kv_dtype", "")) == k and r["ab_bin"] == b]
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
exit $status
