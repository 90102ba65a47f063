#!/usr/bin/env bash
# The wheel where nothing was built: a minimal Debian 12 root filesystem
# (debootstrap --variant=minbase, plus python3, python3-pip, python3-venv:
# no compiler, no -dev package), into which pip alone installs the cp311
# wheel (Debian 12's Python is 3.11) with numpy and torch, from a local
# wheelhouse of PyPI downloads. There, as root in a chroot:
#   1. a NumPy state and a torch state are saved and restored bit-exact;
#   2. the `hoist` command lists and verifies the steps, and an s3:// root
#      says how to get object storage (pyarrow is not installed);
#   3. `pip install` of the sdist stops at once, listing what is missing.
# It runs on its own, outside the suite: about 80 s with the downloads
# cached, but the first run downloads 3 GB (mostly torch's CUDA libraries):
#   tools/wheel.sh 3.11 && tools/clean_root_test.sh
# Needs root (chroot, mounts) and Debian's archive and PyPI (the first run).
# The root filesystem and the wheelhouse are kept in build/cleanroot.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

HOIST_DEBS=(debootstrap)
install_debs

work="$HOIST_ROOT/build/cleanroot"
wheel=$(ls "$HOIST_ROOT"/dist/hoist_checkpoint-*-cp311-cp311-manylinux*.whl 2>/dev/null |
  tail -1)
sdist=$(ls "$HOIST_ROOT"/dist/hoist_checkpoint-*.tar.gz 2>/dev/null | tail -1)
if [[ -z "$wheel" || -z "$sdist" ]]; then
  echo "no cp311 wheel or sdist in dist/: run tools/wheel.sh 3.11 first" >&2
  exit 1
fi
mkdir -p "$work"

# The pristine root, made once; each run works on a fresh copy of it.
if [[ ! -x "$work/pristine/usr/bin/python3" ]]; then
  log "making a Debian 12 root filesystem (debootstrap)"
  rm -rf "$work/pristine"
  debootstrap --variant=minbase --include=python3,python3-pip,python3-venv \
    bookworm "$work/pristine" http://deb.debian.org/debian >"$work/debootstrap.log"
fi

# What pip installs there, downloaded for CPython 3.11 on manylinux.
wheelhouse="$work/wheelhouse"
if [[ ! -f "$wheelhouse/.complete" ]]; then
  log "downloading the wheelhouse (numpy, torch and its dependencies)"
  platforms=(--platform linux_x86_64 --platform manylinux2014_x86_64)
  for minor in $(seq 5 34); do
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
  done
  "$HOIST_VENV/bin/pip" download -q --disable-pip-version-check \
    --python-version 3.11 --only-binary=:all: "${platforms[@]}" \
    -d "$wheelhouse" numpy ml_dtypes torch \
    'scikit-build-core>=0.10' 'nanobind>=2.0' 'pyarrow==26.*' cmake ninja
  touch "$wheelhouse/.complete"
fi

root="$work/run"
unmount() {
  for m in proc dev/shm dev mnt/dist mnt/wheelhouse; do
    mountpoint -q "$root/$m" && umount -l "$root/$m"
  done
  return 0
}
trap unmount EXIT
unmount
log "copying the root filesystem"
rm -rf "$root"
cp -a "$work/pristine" "$root"
mkdir -p "$root/mnt/dist" "$root/mnt/wheelhouse"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/dev/shm"
mkdir -p "$root/mnt/dist/w"
cp "$wheel" "$sdist" "$root/mnt/dist/w/"
mount --bind -o ro "$wheelhouse" "$root/mnt/wheelhouse"

log "installing and using the wheel in the chroot"
cp "$HOIST_ROOT/tools/clean_root_check.sh" "$root/check.sh"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root bash /check.sh "/mnt/dist/w/$(basename "$wheel")" \
  "/mnt/dist/w/$(basename "$sdist")"
log "clean root test passed"
