#!/usr/bin/env bash
# Installs what is missing, builds hoist (build/release) and runs its main job.
# Extra arguments go to `hoist plan`.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_debs
build_dir release -DCMAKE_BUILD_TYPE=RelWithDebInfo
log "hoist plan $*"
build/release/hoist plan "$@"
