#!/usr/bin/env bash
# Installs what is missing, builds hoist (build/release) and its Python
# package (into .venv), and runs the main job, `hoist demo`. Extra arguments go to `hoist demo` (see `hoist demo --help`).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# The set-up reports to stderr: stdout is hoist demo's own (--json).
# The Python packages come first: the C++ build links Arrow's object-store
# filesystems from .venv's pyarrow.
{
  install_debs
  python_requirements python/requirements.txt
  # The real CUDA runtime (tools/test.sh links the simulator here).
  build_dir release "${HOIST_RELEASE[@]}" -DHOIST_CUDA_SIM=OFF
  python_hoist  # `import hoist` in .venv
} >&2
log "hoist demo $*"
build/release/hoist demo "$@"
