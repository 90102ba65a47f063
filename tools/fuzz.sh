#!/usr/bin/env bash
# hoist's libFuzzer targets (fuzz/), built with AddressSanitizer in
# build/asan (tools/test.sh builds it).
#
#   tools/fuzz.sh [TARGET...]          each target for HOIST_FUZZ_SECONDS
#                                      (default 20), side by side: CI's run
#   tools/fuzz.sh --long [TARGET...]   each for at least --seconds (default
#                                      1800) and at least --runs executions
#                                      (default 1000000), --jobs at a time
#                                      (default: the cores)
#
# Targets: manifest_fuzzer (a manifest's decoding, hoist/1, hoist/2 with
# references and split hoist/3; its streamed and whole-document ways
# agree), restore_fuzzer
# (restore planning and reads against any manifest and bytes), part_fuzzer
# (a local tier's part as a peer holds it: PART.json and its data),
# safetensors_fuzzer (the import's parser). Every run starts from the
# corpus in fuzz/corpus/<seeds>/ with the manifest dictionary, and what
# earlier long runs kept in fuzz/corpus/<target>/. Inputs up to 512 KiB in
# the short run (the seeds with thousands of extents, against quadratic
# costs), 64 KiB in the long one (larger inputs ran at a few executions a
# second and starved the rest). The short run keeps what it finds in
# build/asan/fuzz-corpus/, out of the repository; the long run merges what
# it found into fuzz/corpus/<target>/ (minimized: only inputs that add
# coverage), for the next run and for CI's, and prints each target's
# executions, rate and peak memory (docs/robustness.md records them). A
# crash stops that target, keeps the input in build/asan/fuzz-crashes/ and
# fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

long=0 seconds=${HOIST_FUZZ_SECONDS:-20} runs=0 jobs=$(nproc) targets=()
max_len=524288
while [ $# -gt 0 ]; do
  case $1 in
    --long) long=1; seconds=1800; runs=1000000; max_len=65536; shift ;;
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help)  # the comment at the top
      awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
      exit 0 ;;
    -*) echo "tools/fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] ||
  targets=(manifest_fuzzer restore_fuzzer part_fuzzer safetensors_fuzzer)

# The checked-in inputs each target starts from: the hand-made seeds, and
# what long runs merged into fuzz/corpus/TARGET.
seeds_of() {
  case $1 in
    manifest_fuzzer | restore_fuzzer) echo fuzz/corpus/manifest ;;
    part_fuzzer) echo fuzz/corpus/part ;;
    safetensors_fuzzer) echo fuzz/corpus/safetensors ;;
    *) echo "tools/fuzz.sh: no target $1" >&2; return 1 ;;
  esac
  if [ -d "fuzz/corpus/$1" ]; then echo "fuzz/corpus/$1"; fi
}

for target in "${targets[@]}"; do
  seeds_of "$target" >/dev/null
  [ -x "build/asan/fuzz/$target" ] || {
    echo "tools/fuzz.sh: build/asan/fuzz/$target is not built (run" \
      "tools/test.sh, or cmake --build build/asan)" >&2
    exit 1
  }
done

out=build/asan/fuzz-logs
mkdir -p "$out" build/asan/fuzz-crashes
common=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512
  -print_final_stats=1 -dict=fuzz/manifest.dict -max_len="$max_len"
  -artifact_prefix=build/asan/fuzz-crashes/)

# One target: until `seconds` have passed, then on until `runs`
# executions (libFuzzer's own count, summed over its sessions).
fuzz_one() {
  local target=$1 found log executed=0 rounds=0
  found=build/asan/fuzz-corpus/$target
  log=$out/$target.log
  mkdir -p "$found"
  : >"$log"
  # shellcheck disable=SC2046
  "build/asan/fuzz/$target" "${common[@]}" -max_total_time="$seconds" \
    "$found" $(seeds_of "$target") >>"$log" 2>&1 || return 1
  executed=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" |
    awk '{s += $2} END {print s + 0}')
  while [ "$executed" -lt "$runs" ] && [ $rounds -lt 100 ]; do
    rounds=$((rounds + 1))
    # shellcheck disable=SC2046
    "build/asan/fuzz/$target" "${common[@]}" -runs=$((runs - executed)) \
      "$found" $(seeds_of "$target") >>"$log" 2>&1 || return 1
    executed=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" |
      awk '{s += $2} END {print s + 0}')
  done
}

summary() {
  local target=$1 log=$out/$1.log
  awk -v t="$target" '
    /stat::number_of_executed_units/ {runs += $2}
    /stat::average_exec_per_sec/ {rates[++n] = $2}
    /stat::peak_rss_mb/ {if ($2 > rss) rss = $2}
    /^Done [0-9]+ runs in [0-9]+ second/ {secs += $(NF-1)}
    END {printf "%-20s %10d runs %7d s %8.0f exec/s %6d MB peak\n",
         t, runs, secs, (secs > 0 ? runs / secs : rates[n]), rss}' "$log"
}

echo "fuzzing ${targets[*]}: $([ $long = 1 ] &&
  echo "at least ${seconds}s and $runs runs each, $jobs at a time" ||
  echo "${seconds}s each, side by side")"
failed=0
if [ $long = 0 ]; then jobs=${#targets[@]}; fi
running=() names=()
reap() {  # waits for the oldest target still running
  local pid=${running[0]} name=${names[0]}
  running=("${running[@]:1}") names=("${names[@]:1}")
  if ! wait "$pid"; then
    tail -n 40 "$out/$name.log" >&2
    echo "$name found a failure ($out/$name.log; the input is in" \
      "build/asan/fuzz-crashes/)" >&2
    failed=1
  fi
  summary "$name"
}
for target in "${targets[@]}"; do
  while [ ${#running[@]} -ge "$jobs" ]; do reap; done
  fuzz_one "$target" &
  running+=($!) names+=("$target")
done
while [ ${#running[@]} -gt 0 ]; do reap; done
[ $failed = 0 ] || exit 1

if [ $long = 1 ]; then
  # What the run found that adds coverage, into the repository's corpus.
  for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    # shellcheck disable=SC2046
    "build/asan/fuzz/$target" -merge=1 -dict=fuzz/manifest.dict \
      -max_len="$max_len" "fuzz/corpus/$target" "build/asan/fuzz-corpus/$target" \
      >>"$out/$target.merge.log" 2>&1
    echo "$target: fuzz/corpus/$target holds" \
      "$(find "fuzz/corpus/$target" -type f | wc -l) inputs"
  done
fi
