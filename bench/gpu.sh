#!/usr/bin/env bash
# The CUDA backend's checks on a machine with a GPU, in one prepared step.
#
#   bench/gpu.sh prepare   here (no GPU needed): build build/release and put
#                          gpu_bench, device_test and the shared libraries
#                          they need into .gpu/ (git-ignored)
#   bench/gpu.sh run       on the GPU machine, with .gpu carried there: the
#                          CUDA device tests, then bench/gpu's table (as JSON
#                          in $OUT/gpu_bench.json when $OUT is set)
#
# The GPU machine has no package registry and none of hoist's libraries, so
# the binaries are built here and travel with their libraries (x86-64 both).
# With the device tool: run(command="bench/gpu.sh run", carry=[".gpu"]).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
  prepare)
    source tools/common.sh
    install_debs
    build_dir release -DCMAKE_BUILD_TYPE=RelWithDebInfo
    [ -x build/release/bench/gpu_bench ] || {
      echo "gpu.sh: no gpu_bench: the build found no CUDA toolkit" >&2
      exit 1
    }
    rm -rf .gpu && mkdir -p .gpu/lib
    cp build/release/bench/gpu_bench build/release/src/hoist/device/device_test .gpu/
    for binary in .gpu/gpu_bench .gpu/device_test; do
      ldd "$binary" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
          libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
          *) cp -n "$lib" .gpu/lib/ ;;
        esac
      done
    done
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
    du -sh .gpu
    ;;
  run)
    export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    .gpu/device_test --gtest_filter='Cuda*'
    if [ -n "${OUT:-}" ]; then
      .gpu/gpu_bench --json | tee "$OUT/gpu_bench.json"
    fi
    .gpu/gpu_bench
    ;;
  *)
    echo "usage: bench/gpu.sh prepare|run" >&2
    exit 2
    ;;
esac
