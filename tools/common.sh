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
  openmpi-bin libopenmpi-dev
)

# Each line starts with the seconds since the script started (bash's
# SECONDS), so a slow CI run shows which step took the time.
log() { printf '\033[1m==> [%4ds] %s\033[0m\n' "$SECONDS" "$*" >&2; }

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

# build_dir NAME [cmake args...]: configure (once) and build build/NAME.
build_dir() {
  local name=$1
  shift
  local dir="$HOIST_ROOT/build/$name"
  # Configuring again is cheap and applies options added since the last run.
  log "configuring build/$name"
  cmake -S "$HOIST_ROOT" -B "$dir" -G Ninja "$@" >/dev/null
  log "building build/$name"
  cmake --build "$dir" -j "$(nproc)"
}

# build/release, as tools/demo.sh and tools/test.sh both configure it: a
# unity build (CMAKE_UNITY_BUILD: each target's sources compiled in batches
# of 8, so the headers they share are parsed once a batch), which halves its
# compile time on a fresh clone; a change to one file recompiles its batch.
# tools/test.sh's TSan build compiles every file on its own, which checks
# that each includes what it uses.
HOIST_RELEASE=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON)

# python_package REQUIREMENTS: the project's virtualenv (.venv, Python 3.12;
# made once), the packages in REQUIREMENTS (pip skips what is installed),
# and the hoist package itself, built from this tree (build/python is reused).
HOIST_VENV="$HOIST_ROOT/.venv"
HOIST_UV_VERSION=0.13.9
python_package() {
  python_requirements "$1"
  python_hoist
}

# python_requirements REQUIREMENTS: the virtualenv and REQUIREMENTS only
# (downloads, mostly: a caller may run it beside a C++ build).
python_requirements() {
  local requirements=$1
  if [[ ! -x "$HOIST_VENV/bin/python" ]]; then
    local python=/root/.pyenv/versions/3.12.1/bin/python3.12
    [[ -x "$python" ]] || python=$(command -v python3.12 || command -v python3)
    log "creating the virtualenv .venv ($("$python" --version))"
    "$python" -m venv "$HOIST_VENV"
  fi
  log "installing Python packages ($requirements)"
  # Through uv (from PyPI, pinned): it downloads in parallel and unpacks
  # the test requirements' 6 GB in a fifth of pip's CPU time, which on two
  # cores the C++ build beside it gets back. It trusts the system's
  # certificates and pip's --find-links as pip does, and compiles the
  # bytecode now as pip does (else the tests' first imports of torch and jax
  # compile it, on the critical path: pytest took 100 s longer); pip takes
  # over where uv cannot be had or fails.
  if "$HOIST_VENV/bin/pip" install -q --disable-pip-version-check \
    "uv==$HOIST_UV_VERSION" &&
    "$HOIST_VENV/bin/uv" pip install -q --native-tls --compile-bytecode \
      ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} \
      --python "$HOIST_VENV/bin/python" -r "$HOIST_ROOT/$requirements"; then
    return
  fi
  "$HOIST_VENV/bin/pip" install -q --disable-pip-version-check \
    -r "$HOIST_ROOT/$requirements"
}

# python_hoist: the hoist package, built from this tree into the virtualenv.
python_hoist() {
  log "building the hoist Python package"
  # Until 0.1.0 the distribution was named "hoist" (an unrelated project's
  # name on PyPI); an old .venv's copy goes first, or its files would stay.
  if "$HOIST_VENV/bin/pip" show -q hoist >/dev/null 2>&1; then
    "$HOIST_VENV/bin/pip" uninstall -q -y hoist
  fi
  "$HOIST_VENV/bin/pip" install -q --disable-pip-version-check \
    --no-build-isolation "$HOIST_ROOT"
}
