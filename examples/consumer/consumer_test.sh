#!/usr/bin/env bash
# Installs the build tree BUILD into a fresh prefix, builds examples/consumer
# against it with find_package(hoist), and runs it.
# Usage: consumer_test.sh BUILD_DIR CONSUMER_SOURCE_DIR CXX_COMPILER
set -euo pipefail
build=$1 source=$2 cxx=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
[ -f "$work/prefix/lib/cmake/hoist/hoistConfig.cmake" ] ||
  { echo "consumer_test: no hoistConfig.cmake installed" >&2; exit 1; }
[ -f "$work/prefix/include/hoist/checkpoint_root.h" ] ||
  { echo "consumer_test: public headers not installed" >&2; exit 1; }
if [ -d "$work/prefix/include/hoist/checkpoint" ]; then
  echo "consumer_test: private headers were installed" >&2
  exit 1
fi
cmake -S "$source" -B "$work/build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; exit 1; }
"$work/build/consumer" "$work/root"
echo "consumer_test: 1 passed, 0 failed"
