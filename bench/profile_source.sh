#!/usr/bin/env bash
# Source-level Nsight Compute profile of one kernel launch in a decode run, on
# the GPU machine: warp-stall samples per SASS instruction, to see where a
# latency-bound kernel waits. Writes NAME.ncu-rep, NAME_details.txt and
# NAME_source.csv (one row per SASS instruction: stall reasons, executions)
# under $OUT (or /tmp) and prints the headline figures.
#   bench/profile_source.sh NAME KERNEL_REGEX MODEL [PROMPT] [SKIP]
# e.g. bench/profile_source.sh attn decode_kernel synthetic:qwen2.5-0.5b 512 40
# SKIP launches of the kernel are passed over first (default 40: past the
# warm-up run's steps).
set -uo pipefail
OUT=${OUT:-/tmp}
name=$1 kernel=$2 model=$3 prompt=${4:-512} skip=${5:-40}
timeout 300 ncu --clock-control none --cache-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis \
  --section LaunchStats --warp-sampling-interval 0 -o "$OUT/$name" \
  build/cuda/kvgraph bench --device cuda --models "$model" --prompt "$prompt" --new-tokens 4 --eager --quiet \
  > "$OUT/$name.log" 2>&1
echo "$name: ncu rc $?"
ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
ncu -i "$OUT/$name.ncu-rep" --page source --print-source sass --csv > "$OUT/${name}_source.csv" 2>&1
grep -E "Duration|Warp Cycles Per Issued|Grid Size|DRAM Throughput|L2 Hit" "$OUT/${name}_details.txt" | head
