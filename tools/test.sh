#!/usr/bin/env bash
# Installs what is missing, then checks everything CI checks:
#   1. formatting (clang-format, Google style) of every C++ source;
#   2. the release build (g++, -Werror) and its tests;
#   3. a clang build with -Wthread-safety, ASan and UBSan, and its tests.
# Exits non-zero on the first failure.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_debs

log "checking formatting"
mapfile -t sources < <(git ls-files --cached --others --exclude-standard \
  '*.cc' '*.h' '*.cu' '*.cuh')
if ((${#sources[@]})); then
  clang-format --dry-run -Werror "${sources[@]}"
fi

jobs=$(nproc)
build_dir release -DCMAKE_BUILD_TYPE=RelWithDebInfo
log "testing build/release"
ctest --test-dir build/release --output-on-failure -j "$jobs"

build_dir asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
  -DHOIST_SANITIZE=ON -DHOIST_BUILD_BENCH=OFF
log "testing build/asan (clang, -Wthread-safety, ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j "$jobs"

log "all checks passed"
