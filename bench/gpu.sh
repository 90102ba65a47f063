#!/usr/bin/env bash
# The CUDA path on a machine with a GPU, proven in one short call.
#
#   bench/gpu.sh prepare   here (no GPU needed): build build/gpu (the test
#                          suite's release flags, no MPI, no object stores,
#                          libstdc++ and libgcc linked statically) and
#                          put hoist, gpu_bench, device_test and every shared
#                          library they load into .gpu/ (git-ignored), glibc
#                          and its loader included
#   bench/gpu.sh run       on the GPU machine, with .gpu carried there, every
#                          step's output under $OUT (default .gpu/out):
#                            0. ldd --version, nvidia-smi, and whether the
#                               carried binaries start (a clear message if
#                               not, never a bare loader error)
#                            1. the CUDA device tests (device_test.txt)
#                            2. gpu_bench once: its table (gpu_bench.txt)
#                               and JSON (gpu_bench.json) from the same run:
#                               D2H limit, staging, batched dispatch, save /
#                               restore round trip, and the fence (the CPU
#                               waiting for the copies against the training
#                               stream ordered after them)
#                            3. hoist demo --backend cuda --json (demo.json):
#                               save, restore onto the other mesh, verify
#                          A step that fails does not stop the ones after
#                          it; the exit status is non-zero if any failed.
#
# The GPU machine has no package registry and none of hoist's libraries, and
# its image is not this one, so the binaries travel with what they load.
# Where its glibc is older than the one they were linked against, they run
# through the carried loader and glibc instead of the machine's.
# With the device tool: run(command="bench/gpu.sh run", carry=[".gpu"]).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

binaries=(hoist gpu_bench device_test)
# The parts of glibc, which must come from one build with their loader.
glibc_re='^(ld-linux[^/]*|libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so'

prepare() {
  source tools/common.sh
  install_debs
  # The suite's release build's flags (HOIST_RELEASE, tools/common.sh), so
  # that what tools/test.sh compiles is what this compiles: a Release (-O3)
  # build here once stopped on a GCC warning no suite build showed.
  log "configuring build/gpu"
  cmake -S . -B build/gpu -G Ninja "${HOIST_RELEASE[@]}" \
    -DHOIST_WITH_MPI=OFF -DHOIST_WITH_OBJECT_STORE=OFF \
    -DHOIST_STATIC_RUNTIME=ON -DHOIST_CUDA_SIM=OFF >/dev/null
  log "building ${binaries[*]} in build/gpu"
  cmake --build build/gpu -j "$(nproc)" --target "${binaries[@]}"
  [ -x build/gpu/bench/gpu_bench ] || {
    echo "gpu.sh: no gpu_bench: the build found no CUDA toolkit" >&2
    exit 1
  }
  rm -rf .gpu && mkdir -p .gpu/lib .gpu/glibc
  cp build/gpu/hoist build/gpu/bench/gpu_bench \
    build/gpu/src/hoist/device/device_test .gpu/
  local binary lib name
  for binary in "${binaries[@]}"; do
    ldd ".gpu/$binary" | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}' |
      while read -r lib; do
        name=$(basename "$lib")
        if [[ $name =~ $glibc_re ]]; then
          cp -nL "$lib" .gpu/glibc/
        else
          cp -nL "$lib" .gpu/lib/
        fi
      done
  done
  # The newest glibc symbol version anything carried needs.
  objdump -T .gpu/"${binaries[0]}" .gpu/gpu_bench .gpu/device_test .gpu/lib/* |
    grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1 \
    >.gpu/glibc-needed
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
  echo "carried: ${binaries[*]}; libraries: $(ls .gpu/lib | tr '\n' ' ')"
  echo "glibc needed: $(cat .gpu/glibc-needed) (carried: $(ls .gpu/glibc | tr '\n' ' '))"
  # The device tool carries at most 64 MiB: Arrow's libraries alone (the
  # object stores, which the GPU run does not use) were 66 MB of 109.
  local carried_kib
  carried_kib=$(du -sk .gpu | cut -f1)
  echo "bundle: $((carried_kib / 1024)) MiB (the device tool carries at most 64)"
  if ((carried_kib > 60 * 1024)); then
    echo "gpu.sh: .gpu is $((carried_kib / 1024)) MiB, over the 60 MiB this" \
      "script allows itself: leave out what the GPU run does not load" >&2
    exit 1
  fi
}

# version_lt A B: whether version A sorts before version B.
version_lt() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }

run() {
  [ -d .gpu ] || {
    echo "gpu.sh: no .gpu here: run 'bench/gpu.sh prepare' first and carry .gpu" >&2
    exit 2
  }
  local out=${OUT:-.gpu/out}
  mkdir -p "$out"
  local failed=()
  echo "== ldd --version"
  ldd --version 2>&1 | sed -n 1p || true
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv ||
    echo "gpu.sh: nvidia-smi failed: this machine shows no NVIDIA driver or GPU"
  local have need launch=()
  have=$(ldd --version 2>&1 | sed -n '1s/.* \([0-9]\+\.[0-9]\+\)$/\1/p' || true)
  [ -n "$have" ] || have=0
  need=$(cat .gpu/glibc-needed)
  if version_lt "$have" "$need"; then
    echo "glibc here $have < $need needed: running through the carried loader"
    launch=(.gpu/glibc/ld-linux-x86-64.so.2 --library-path ".gpu/lib:.gpu/glibc")
  else
    export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  local binary
  for binary in "${binaries[@]}"; do
    if ! "${launch[@]}" ".gpu/$binary" --help >/dev/null 2>"$out/start.err"; then
      echo "gpu.sh: .gpu/$binary does not start on this machine:" >&2
      cat "$out/start.err" >&2
      exit 1
    fi
  done
  echo "== device tests"
  "${launch[@]}" .gpu/device_test --gtest_filter='Cuda*' 2>&1 |
    tee "$out/device_test.txt" || failed+=(device_test)
  echo "== gpu_bench"
  "${launch[@]}" .gpu/gpu_bench --bytes "${GPU_BENCH_BYTES:-4GiB}" \
    --json-file "$out/gpu_bench.json" 2>&1 | tee "$out/gpu_bench.txt" ||
    failed+=(gpu_bench)
  echo "== hoist demo --backend cuda"
  local gpus
  gpus=$( (nvidia-smi --list-gpus 2>/dev/null || true) | grep -c '^GPU' || true)
  ((gpus > 0)) || gpus=1
  if "${launch[@]}" .gpu/hoist demo --backend cuda --mesh "1x$gpus" \
    --size "${GPU_DEMO_SIZE:-2GiB}" --json >"$out/demo.json" 2>"$out/demo.err"; then
    cat "$out/demo.json"
  else
    cat "$out/demo.err" >&2
    failed+=(demo)
  fi
  if ((${#failed[@]})); then
    echo "gpu.sh: failed: ${failed[*]} (outputs in $out)" >&2
    exit 1
  fi
  echo "gpu.sh: every step passed (outputs in $out)"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: bench/gpu.sh prepare|run" >&2
    exit 2
    ;;
esac
