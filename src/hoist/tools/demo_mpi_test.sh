#!/usr/bin/env bash
# `mpirun -np 4 hoist demo`: four processes share the 2 x 4 mesh's devices
# and one root; the JSON summary (rank 0) must say 4 processes, verified.
# Usage: demo_mpi_test.sh MPIEXEC PATH_TO_HOIST PATH_TO_CRASH_SAVER
set -euo pipefail
mpiexec=$1
hoist=$2
saver=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "demo_mpi_test: FAILED: $*" >&2; exit 1; }
# No CMA (ptrace) in containers: the shared-memory transport copies instead.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
"$mpiexec" -np 4 --oversubscribe --allow-run-as-root "$hoist" demo \
  --size 16MiB --vocab 512 --steps 4 --save-every 2 --step-time 0ms \
  --root "$dir/r" --keep-files --json >"$dir/demo.json" ||
  fail "mpirun hoist demo exit"
grep -q '"processes": 4' "$dir/demo.json" || fail "not 4 processes"
grep -q '"verified": true' "$dir/demo.json" || fail "not verified"
# Every rank wrote its own data file into the one step directory.
for r in 0 1 2 3; do
  [[ -f "$dir/r/step_00000004/data/r0000${r}_w00.bin" ]] ||
    fail "rank $r wrote no data file"
done
"$hoist" verify "$dir/r/step_00000004" >/dev/null || fail "verify"

# The local tier: steps 2 and 6 local (each rank's part on its own root,
# the boxes no other rank holds copied to the next rank), step 4 durable;
# rank 2's local root is lost before the restore, which must still take
# step 6 from the local tier, rank 2's part rebuilt from the other ranks'
# parts and copies, bit-exact.
"$mpiexec" -np 4 --oversubscribe --allow-run-as-root "$hoist" demo \
  --size 16MiB --vocab 512 --steps 6 --save-every 2 --step-time 0ms \
  --root "$dir/t" --local-root "$dir/local/{rank}" --persist-every 4 \
  --lose-local 2 --json >"$dir/tiers.json" 2>"$dir/tiers.err" ||
  fail "mpirun hoist demo --local-root: $(tail -3 "$dir/tiers.err")"
grep -q '"verified": true' "$dir/tiers.json" || fail "tiers: not verified"
grep -q '"restored_from": "local"' "$dir/tiers.json" ||
  fail "tiers: not restored from the local tier"
grep -q '"restored_step": 6' "$dir/tiers.json" || fail "tiers: not step 6"
grep -q "rank 2's part from rank" "$dir/tiers.json" ||
  fail "tiers: rank 2's part was not rebuilt from the other ranks"
grep -q '"restore_durable_s": [0-9]' "$dir/tiers.json" ||
  fail "tiers: no durable restore to compare with"
[[ -d "$dir/local/2/step_00000006" ]] || fail "tiers: rank 2's part not back"

# A rank killed with SIGKILL mid-training (crash_saver: a job saving step
# after step, rank 0 printing "committed N"): mpirun takes the job down;
# every step committed before stays whole.
coproc SAVER {
  exec "$mpiexec" -np 4 --oversubscribe --allow-run-as-root "$saver" \
    "$dir/k" 1 2>"$dir/k.err"
}
job=$SAVER_PID
committed=0
while read -r what step _ <&"${SAVER[0]}"; do
  [[ $what == committed ]] && committed=$step
  ((committed >= 5)) && break
done
((committed >= 5)) || fail "no step 5 before the kill: $(tail -3 "$dir/k.err")"
victim=$(pgrep -P "$job" | sed -n 3p)
[[ -n "$victim" ]] || fail "no rank to kill"
kill -KILL "$victim"
if wait "$job"; then fail "the job survived a killed rank"; fi
# The committed steps (a step pruned while later ones reference its bytes
# stays as a referenced step, no checkpoint: docs/delta.md).
kept=$("$hoist" ls "$dir/k" --json | python3 -c 'import json, sys
print(" ".join(str(e["step"]) for e in json.load(sys.stdin)
               if e.get("state") == "committed"))')
steps=$(wc -w <<<"$kept")
((steps >= 3)) || fail "only $steps steps kept"
for n in $kept; do
  step="$dir/k/step_$(printf %08d "$n")"
  "$hoist" verify "$step" >/dev/null || fail "$step does not verify after the kill"
done
[[ -d "$dir/k/step_$(printf %08d "$committed")" ]] ||
  fail "step $committed was acknowledged but is missing"
echo "demo_mpi_test: passed ($steps steps intact after a rank was killed)"
