#!/usr/bin/env bash
# Installs what is missing, then checks everything CI checks:
#   1. formatting (clang-format, Google style) of every C++ source;
#   2. the release build (g++, -Werror) and its tests (ctest, MPI tests under
#      mpirun included), then the Python package and its tests (pytest);
#   3. a clang build with -Wthread-safety, ASan and UBSan, and its tests;
#   4. a clang build with ThreadSanitizer, and its tests;
#   5. the libFuzzer targets (manifest decoding, restore, safetensors headers)
#      side by side for a bounded time.
# The Python packages download while the release build compiles.
# Exits non-zero on the first failure.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_debs

# The package's own requirements first (pyarrow among them: the C++ build
# links Arrow's object-store filesystems from it, and the object-store
# tests run the servers they bring); the object-store tests then fail
# instead of skipping when a server cannot start.
python_requirements python/requirements.txt
export HOIST_REQUIRE_OBJECT_STORE=1

# The test packages download beside the C++ build (the network, not the
# cores, is what they wait on); their log is shown if they fail.
pip_log=$(mktemp)
python_requirements python/requirements-test.txt >"$pip_log" 2>&1 &
pip_pid=$!

log "checking formatting"
mapfile -t sources < <(git ls-files --cached --others --exclude-standard \
  '*.cc' '*.h' '*.cu' '*.cuh')
if ((${#sources[@]})); then
  clang-format --dry-run -Werror "${sources[@]}"
fi

jobs=$(nproc)
build_dir release "${HOIST_RELEASE[@]}"
log "testing build/release"
ctest --test-dir build/release --output-on-failure -j "$jobs"

if ! wait "$pip_pid"; then
  cat "$pip_log" >&2
  echo "installing the Python packages failed" >&2
  exit 1
fi
cat "$pip_log"
rm -f "$pip_log"
python_hoist
# One pytest worker per core (pytest-xdist), each taking the next test as it
# finishes one (worksteal): many tests wait on their own subprocesses
# (torchrun, jax.distributed, the examples), and a worker that waits leaves
# its core to the other. 118-124 s where one worker took 160 s.
log "testing the Python package (pytest, $jobs workers)"
"$HOIST_VENV/bin/python" -m pytest -q -rs -n "$jobs" --dist worksteal python/tests

# A unity build, as build/release is (tools/common.sh): a third less compile
# time on every fresh clone.
build_dir asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
  -DHOIST_SANITIZE=ON -DHOIST_BUILD_BENCH=OFF -DHOIST_FUZZ=ON \
  -DCMAKE_UNITY_BUILD=ON
log "testing build/asan (clang, -Wthread-safety, ASan + UBSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build/asan --output-on-failure -j "$jobs"

# The CLI and examples are left out of the TSan build: their threads are
# the library's, which the unit tests drive, and the ASan build runs them.
# It is the one build that compiles each source file on its own (no unity
# batches), which checks that every library and test file includes what it
# uses.
build_dir tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DHOIST_TSAN=ON -DHOIST_BUILD_BENCH=OFF -DHOIST_BUILD_TOOLS=OFF
log "testing build/tsan (clang, ThreadSanitizer)"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$HOIST_ROOT/tools/tsan.supp \
  ctest --test-dir build/tsan --output-on-failure -j "$jobs"

# Fuzzing: each libFuzzer target on the checked-in corpus (deep nesting,
# huge claims, many extents, a pinwheel tiling, far offsets, references, a
# local part) plus what earlier long runs kept, side by side for
# HOIST_FUZZ_SECONDS (default 20; 0 skips them, for a run beside a
# tools/fuzz.sh --long, which runs them for hours).
if [ "${HOIST_FUZZ_SECONDS:-20}" != 0 ]; then
  log "fuzzing (tools/fuzz.sh)"
  tools/fuzz.sh
fi

log "all checks passed"
