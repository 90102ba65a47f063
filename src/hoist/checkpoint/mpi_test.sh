#!/usr/bin/env bash
# Multi-process saves and restores under mpirun: save on 4 ranks x 2 devices,
# then restore the same root on 2 ranks x 4 devices and on 1 rank x 8.
#   mpi_test.sh MPIEXEC TEST_BINARY
set -euo pipefail
mpiexec=$1
binary=$2
root=$(mktemp -d "${TMPDIR:-/tmp}/hoist_mpi_XXXXXX")
trap 'rm -rf "$root"' EXIT
export HOIST_MPI_ROOT=$root/ckpt
# No CMA (ptrace) in containers: the shared-memory transport copies instead.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
run() {
  local np=$1 filter=$2
  echo "== mpirun -np $np ($filter)"
  "$mpiexec" -np "$np" --oversubscribe --allow-run-as-root \
    "$binary" --gtest_filter="$filter" --gtest_brief=1
}
run 4 'Save.*'
run 4 'Preempt.*'
run 2 'Restore.*'
run 1 'Restore.*'
run 4 'Tiers.*'
# Rank 2 dies mid-save: mpirun must report the job failed.
if run 4 'TiersKill.*' 2>/dev/null; then
  echo "mpi_test: the job whose rank died did not fail" >&2
  exit 1
fi
run 4 'TiersAfterKill.*'
echo "mpi_test: all phases passed"
