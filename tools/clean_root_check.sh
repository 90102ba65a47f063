#!/usr/bin/env bash
# Runs inside tools/clean_root_test.sh's chroot (a bare Debian 12 with
# python3 and pip, the wheelhouse at /mnt/wheelhouse).
# Usage: clean_root_check.sh WHEEL SDIST
set -euo pipefail
wheel=$1
sdist=$2
fail() { echo "clean_root_check: FAILED: $*" >&2; exit 1; }
step() { printf '\033[1m--> %s\033[0m\n' "$*"; }

step "nothing to build with: no compiler, no headers"
for tool in cc c++ gcc g++ clang++ cmake; do
  ! command -v "$tool" >/dev/null || fail "$tool is installed"
done
[[ ! -e /usr/include/absl && ! -e /usr/include/xxhash.h ]] ||
  fail "build headers are installed"
python3 --version

step "pip install the wheel, numpy and torch (no index: the wheelhouse)"
python3 -m venv /opt/venv
pip=(/opt/venv/bin/pip install -q --disable-pip-version-check --no-index
  --find-links /mnt/wheelhouse)
"${pip[@]}" "$wheel" torch
py=/opt/venv/bin/python

step "save and restore a NumPy state and a torch state"
mkdir -p /ckpt
"$py" - <<'PY'
import numpy as np
import torch

import hoist

rng = np.random.default_rng(0)
state = {"w": rng.standard_normal((256, 64)).astype(np.float32),
         "step": np.int64(7),
         "emb": rng.integers(0, 255, (1000, 3)).astype(np.uint8)}
mgr = hoist.CheckpointManager("/ckpt/numpy", keep=2)
for step in (1, 2):
    mgr.save(step, state)
mgr.wait_until_finished()
back = mgr.restore(like=state)
assert all(np.array_equal(back[k], state[k]) for k in state), "numpy"
mgr.close()

model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 4))
opt = torch.optim.Adam(model.parameters())
model(torch.randn(8, 32)).sum().backward()
opt.step()
state = {"model": model.state_dict(), "opt": opt.state_dict()}
mgr = hoist.CheckpointManager("/ckpt/torch")
mgr.save(3, state).wait()
fresh = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 4))
back = mgr.restore(like={"model": fresh.state_dict(),
                         "opt": opt.state_dict()})
for k, v in model.state_dict().items():
    assert torch.equal(back["model"][k], v), k
assert torch.equal(back["opt"]["state"][0]["exp_avg"],
                   opt.state_dict()["state"][0]["exp_avg"])
mgr.close()
print("hoist", hoist.__version__, "torch", torch.__version__, ": restored")
PY

step "the hoist command: ls, verify, and an s3:// root without pyarrow"
/opt/venv/bin/hoist --version
/opt/venv/bin/hoist ls /ckpt/numpy | tee /tmp/ls.txt
grep -q "^ *2 " /tmp/ls.txt || fail "hoist ls lists no step 2"
/opt/venv/bin/hoist verify /ckpt/numpy || fail "hoist verify numpy"
/opt/venv/bin/hoist verify /ckpt/torch || fail "hoist verify torch"
if /opt/venv/bin/hoist ls s3://bucket/run 2>/tmp/s3.txt; then
  fail "an s3:// root opened without pyarrow"
fi
grep -q "pip install 'hoist-checkpoint\[s3\]'" /tmp/s3.txt || fail "$(cat /tmp/s3.txt)"

step "pip install of the sdist stops at once, saying what is missing"
if "${pip[@]}" "$sdist" >/tmp/sdist.txt 2>&1; then
  fail "the sdist built here"
fi
grep -A12 "hoist cannot be built here" /tmp/sdist.txt ||
  { cat /tmp/sdist.txt; fail "no list of what is missing"; }
for missing in "C++20 compiler" "abseil" "xxHash" "apt-get install g++"; do
  grep -q "$missing" /tmp/sdist.txt || fail "the list lacks $missing"
done
echo "clean_root_check: passed"
