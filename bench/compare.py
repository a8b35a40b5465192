#!/usr/bin/env python3
"""Side-by-side table of `kvgraph bench --json` and bench/peers/hf_transformers.py
output measured in the same run on the same GPU: decode ms/token, share of the
bandwidth floor, and the speed ratio kvgraph / transformers."""
import json
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def main():
    ours = {r["model"].removeprefix("synthetic:"): r for r in load(sys.argv[1])}
    peer = {r["shape"]: r for r in load(sys.argv[2]) if "shape" in r}
    print(f"{'shape':<14} {'kvgraph ms':>10} {'of floor':>9} {'HF ms':>9} {'HF floor':>9} {'speedup':>8}")
    for shape, r in ours.items():
        p = peer.get(shape, {})
        hf = p.get("ms_per_token")
        line = f"{shape:<14} {r['decode_ms_median']:>10.3f} {100 * r['fraction_of_floor']:>8.1f}%"
        if hf:
            # The same floor (ours: weights + KV read, copy bandwidth measured in this run).
            hf_floor = r["floor_ms"] / hf
            line += f" {hf:>9.3f} {100 * hf_floor:>8.1f}% {hf / r['decode_ms_median']:>7.2f}x"
        else:
            line += f" {'n/a':>9} {'':>9} {'':>8}  ({p.get('error', 'not measured')})"
        print(line)


if __name__ == "__main__":
    main()
