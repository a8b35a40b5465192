#!/usr/bin/env bash
# Builds the fuzz preset (clang, libFuzzer + ASan + UBSan) and runs each
# target of tests/fuzz one after another, starting from its seed corpus.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      default: 60 s each, every target
#   scripts/fuzz.sh --runs N [TARGET...]       N executions each instead of a time
#
# TARGET is a name like "tokenizer" (tests/fuzz/tokenizer_fuzz.cpp). Inputs the
# fuzzer finds go to build/fuzz/corpus/<target> (the seeds in the tree are never
# written); a crash, leak, sanitizer report or timeout leaves its input in
# build/fuzz/artifacts/<target>/ and makes the script exit 1 after the rest ran.
# Extra libFuzzer flags can be passed in FUZZ_FLAGS (e.g. FUZZ_FLAGS=-max_len=65536).
set -euo pipefail
cd "$(dirname "$0")/.."

limit=(-max_total_time=60)
what="60 s"
if [ "${1:-}" = "--runs" ]; then
  [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "kvgraph: error: [fuzz] --runs needs a number of executions" >&2; exit 2; }
  limit=(-runs="$2"); what="$2 executions"; shift 2
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  limit=(-max_total_time="$1"); what="$1 s"; shift
elif [ -n "${1:-}" ] && [ ! -f "tests/fuzz/${1}_fuzz.cpp" ]; then
  echo "kvgraph: error: [fuzz] usage: scripts/fuzz.sh [SECONDS | --runs N] [TARGET...]" >&2; exit 2
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.cpp; do t=$(basename "$f" _fuzz.cpp); targets+=("$t"); done
fi
for t in "${targets[@]}"; do
  [ -f "tests/fuzz/${t}_fuzz.cpp" ] || { echo "kvgraph: error: [fuzz] no target \"$t\" (tests/fuzz/${t}_fuzz.cpp)" >&2; exit 2; }
done

if ! command -v clang++ >/dev/null 2>&1; then
  echo "kvgraph: error: [fuzz] clang++ not found: run scripts/install-deps.sh --fuzz" >&2; exit 1
fi
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

status=0
summary=()
for t in "${targets[@]}"; do
  bin=build/fuzz/fuzz/${t}_fuzz
  corpus=build/fuzz/corpus/$t
  artifacts=build/fuzz/artifacts/$t
  log=build/fuzz/logs/$t.log
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  dict=()
  [ -f "tests/fuzz/dict/$t.dict" ] && dict=(-dict="tests/fuzz/dict/$t.dict")
  echo "[fuzz] $t: $what"
  marker=$(mktemp)  # inputs older than this run (kept from earlier runs) are not counted again
  rc=0
  # -timeout: an input that takes over 10 s is a hang; -rss_limit_mb: over 2 GiB is a runaway allocation.
  # shellcheck disable=SC2086
  "$bin" "${limit[@]}" "${dict[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" ${FUZZ_FLAGS:-} "$corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  # crash-, leak-, timeout-, oom- inputs; slow-unit- ones (slower than 10 s yet within -timeout, a
  # wall-clock reading that a loaded machine also produces) are kept for a look but fail nothing.
  crashes=$(find "$artifacts" -type f -newer "$marker" ! -name 'slow-unit-*' | wc -l)
  rm -f "$marker"
  line="$t: ${execs:-?} executions, ${rate:-?} exec/s, ${secs:-?} s, corpus $(find "$corpus" -type f | wc -l) files, $crashes crash/leak/timeout inputs"
  summary+=("$line")
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    status=1
    echo "kvgraph: error: [fuzz] $t failed (exit $rc); inputs in $artifacts/, log $log:" >&2
    grep -E "^==[0-9]+==ERROR|SUMMARY|runtime error|deadly signal|Test unit written" "$log" | head -20 >&2 || true
  fi
done
printf '[fuzz] %s\n' "${summary[@]}"
exit $status
