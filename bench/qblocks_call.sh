# One device call for issue 13's next step (session 25): qgemv=blocks (x
# prepared once a GEMV) against the default, int4 and int8, its tests and
# compute-sanitizer, step_shape's two new ways of making x when
# build/step_shape is carried, and on an H200 the 32K rows issues 14 and 15
# lack. Carry build/carry_next.txz (bench/pack_carry.sh) and build/step_shape:
#   bash bench/qblocks_call.sh
source bench/call_setup.sh
[ -x build/step_shape ] && timeout 100 build/step_shape 20 | tee $OUT/step_shape3.txt | tail -16
bench_round() {
for w in "int4 --group-size 64" "int8"; do for v in auto qgemv=blocks; do
timeout 60 build/cuda/kvgraph bench --device cuda --quiet --json --models synthetic:llama3.1-8b,synthetic:llama3.2-1b,synthetic:qwen2.5-0.5b --new-tokens 64 --weights $w --tune "${v/#auto/}" 2>&1 | grep '^{' | tee -a $OUT/qblocks.jsonl | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); print("%-14s %-26s %-9s %.3f ms" % (sys.argv[1], r["model"], r.get("weights",""), r["decode_ms_median"]))' "$v"
done; done
}
bench_round
gpu_tests 'CudaQuantLinear.*:CudaQuantModel.*' 150
bench_round
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 build/cuda/kvgraph_gpu_tests --gtest_filter='CudaQuantLinear.Blocks*' > $OUT/memcheck.txt 2>&1; echo memcheck rc $?; tail -2 $OUT/memcheck.txt
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 build/cuda/kvgraph_gpu_tests --gtest_filter='CudaQuantLinear.Blocks*' > $OUT/racecheck.txt 2>&1; echo racecheck rc $?; tail -2 $OUT/racecheck.txt
# On an H200 (the issues' card), the long-context rows issues 14 and 15 last lacked.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for spec in "synthetic:llama3.2-1b 32768 bf16" "synthetic:llama3.2-1b 32768 int8" "synthetic:llama3.2-1b 32768 int4" \
              "synthetic:gemma3-1b 512 bf16" "synthetic:gemma3-1b 32768 bf16" "synthetic:llama3.2-1b 512 bf16"; do
    set -- $spec
    timeout 90 build/cuda/kvgraph bench --device cuda --quiet --json --models $1 --prompt $2 --kv-dtype $3 --new-tokens 64 2>&1 |
      grep '^{' | tee -a $OUT/h200-long.jsonl | python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l); print("%-24s prompt %-6s kv %-5s decode %.3f ms (%.0f%% of floor)" % (r["model"], sys.argv[1], sys.argv[2], r["decode_ms_median"], 100*r["fraction_of_floor"]))' $2 $3
  done
fi
