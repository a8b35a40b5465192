#!/usr/bin/env bash
# kvgraph vs Hugging Face transformers (bf16, static cache + torch.compile),
# batch-1 decode, prompt 512, 256 new tokens, same GPU, same run.
# Usage (on the GPU machine, after `cmake --build --preset cuda`):
#   bench/run_h200.sh [comma-separated shapes] [output dir]
set -euo pipefail
SHAPES=${1:-qwen2.5-0.5b,llama3.2-1b,llama3.1-8b}
OUTDIR=${2:-/tmp}
KVGRAPH=${KVGRAPH:-build/cuda/kvgraph}
models=$(echo "$SHAPES" | sed -E 's/([^,]+)/synthetic:\1/g')
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
"$KVGRAPH" bench --device cuda --models "$models" --prompt 512 --new-tokens 256
"$KVGRAPH" bench --device cuda --models "$models" --prompt 512 --new-tokens 256 --json > "$OUTDIR/kvgraph.jsonl"
python3 bench/peers/hf_transformers.py --shapes "$SHAPES" --prompt 512 --new-tokens 256 --runs 2 > "$OUTDIR/hf.jsonl"
cat "$OUTDIR/hf.jsonl"
python3 bench/compare.py "$OUTDIR/kvgraph.jsonl" "$OUTDIR/hf.jsonl"
