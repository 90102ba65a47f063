#!/usr/bin/env bash
# Installs what is missing, then checks everything CI checks:
#   1. formatting (clang-format, Google style) of every C++ source;
#   2. the release build (g++, -Werror) and its tests (ctest, MPI tests under
#      mpirun included), then the Python package and its tests (pytest);
#   3. a clang build with -Wthread-safety, ASan and UBSan, and its tests;
#   4. a clang build with ThreadSanitizer, and its tests;
#   5. the libFuzzer targets (manifest decoding, restore, safetensors headers)
#      side by side for a bounded time.
# The Python test packages download while the release build compiles, and
# the Python package builds while the release tests run (they wait on
# servers and processes more than they compute). Exits non-zero on the
# first failure; prints each stage's time at the end (docs/development.md
# has their budgets). HOIST_LONG=1 adds the long tests.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

stage "Debian packages"
install_debs

# The package's own requirements first (pyarrow among them: the C++ build
# links Arrow's object-store filesystems from it, and the object-store
# tests run the servers they bring); the object-store tests then fail
# instead of skipping when a server cannot start.
stage "Python requirements (python/requirements.txt)"
python_requirements python/requirements.txt
export HOIST_REQUIRE_OBJECT_STORE=1

# The test packages download beside the C++ build (the network, not the
# cores, is what they wait on); their log is shown if they fail.
pip_log=$(mktemp)
pip_times=$(mktemp)
{
  start=$SECONDS
  python_requirements python/requirements-test.txt
  deepspeed_op
  # PyTorch/XLA's own virtualenv (its torch is pinned apart from .venv's):
  # test_torch_xla.py runs its jobs with it.
  python_xla_requirements
  # vLLM's CPU build's (test_vllm.py loads hoist steps into it).
  python_vllm_requirements
  echo "$start $SECONDS" >"$pip_times"
} >"$pip_log" 2>&1 &
pip_pid=$!

stage "formatting"
mapfile -t sources < <(git ls-files --cached --others --exclude-standard \
  '*.cc' '*.h' '*.cu' '*.cuh')
if ((${#sources[@]})); then
  clang-format --dry-run -Werror "${sources[@]}"
fi

jobs=$(nproc)
stage "build/release"
# The CUDA runtime simulator (testing/cuda_sim) in cudart's place in all
# three builds: the CUDA backend's tests run, under ASan and TSan too
# (docs/cuda.md).
build_dir release "${HOIST_RELEASE[@]}" -DHOIST_CUDA_SIM=ON

# The Python package (a build of its own: the extension and the CLI, with
# Python's flags) compiles beside the release tests.
package_log=$(mktemp)
package_times=$(mktemp)
{
  start=$SECONDS
  python_hoist
  echo "$start $SECONDS" >"$package_times"
} >"$package_log" 2>&1 &
package_pid=$!

stage "tests of build/release (ctest)"
ctest --test-dir build/release --output-on-failure -j "$jobs"

stage "waiting for the Python packages and package"
if ! wait "$pip_pid"; then
  cat "$pip_log" >&2
  echo "installing the Python packages failed" >&2
  exit 1
fi
if ! wait "$package_pid"; then
  cat "$package_log" >&2
  echo "building the hoist Python package failed" >&2
  exit 1
fi
hoist_wheel_into "$HOIST_XLA_VENV"
hoist_wheel_into "$HOIST_VLLM_VENV"
export HOIST_REQUIRE_XLA=1 HOIST_REQUIRE_VLLM=1
cat "$pip_log" "$package_log" >&2
read -r start end <"$pip_times" && stage_record \
  "  beside: Python requirements (-test.txt, -xla.txt, -vllm.txt)" "$start" "$end"
read -r start end <"$package_times" && stage_record \
  "  beside: the hoist Python package" "$start" "$end"
rm -f "$pip_log" "$pip_times" "$package_log" "$package_times"

# One pytest worker per core (pytest-xdist), each taking the next test as it
# finishes one (worksteal): many tests wait on their own subprocesses
# (torchrun, jax.distributed, the examples), and a worker that waits leaves
# its core to the other. 118-124 s where one worker took 160 s.
stage "tests of the Python package (pytest, $jobs workers)"
"$HOIST_VENV/bin/python" -m pytest -q -rs -n "$jobs" --dist worksteal \
  --durations=15 python/tests

# A unity build, as build/release is (tools/common.sh): a third less compile
# time on every fresh clone.
stage "build/asan (clang, -Wthread-safety, ASan + UBSan)"
build_dir asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
  -DHOIST_SANITIZE=ON -DHOIST_BUILD_BENCH=OFF -DHOIST_FUZZ=ON \
  -DCMAKE_UNITY_BUILD=ON -DHOIST_CUDA_SIM=ON
stage "tests of build/asan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build/asan --output-on-failure -j "$jobs"

# The CLI and examples are left out of the TSan build: their threads are
# the library's, which the unit tests drive, and the ASan build runs them.
# It is the one build that compiles each source file on its own (no unity
# batches), which checks that every library and test file includes what it
# uses.
stage "build/tsan (clang, ThreadSanitizer)"
build_dir tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DHOIST_TSAN=ON -DHOIST_BUILD_BENCH=OFF -DHOIST_BUILD_TOOLS=OFF \
  -DHOIST_CUDA_SIM=ON
stage "tests of build/tsan"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$HOIST_ROOT/tools/tsan.supp \
  ctest --test-dir build/tsan --output-on-failure -j "$jobs"

# Fuzzing: each libFuzzer target on the checked-in corpus (deep nesting,
# huge claims, many extents, a pinwheel tiling, far offsets, references, a
# local part) plus what earlier long runs kept, side by side for
# HOIST_FUZZ_SECONDS (default 20; 0 skips them, for a run beside a
# tools/fuzz.sh --long, which runs them for hours).
if [ "${HOIST_FUZZ_SECONDS:-20}" != 0 ]; then
  stage "fuzzing (tools/fuzz.sh)"
  tools/fuzz.sh
fi

stages
log "all checks passed"
