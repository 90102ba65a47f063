"""Uses each built wheel as a user would (tools/wheel.sh runs this last):
for each, a new virtualenv of its Python version gets the wheel with its
`s3` extra from PyPI (pip alone: nothing is built), then, in that Python, a
NumPy state is saved and restored bit-exact on a POSIX root, on S3
(SeaweedFS) and on GCS (fake-gcs-server), both on 127.0.0.1
(testing/object_store_server.py); `import hoist` must import neither torch,
JAX nor pyarrow; the `hoist` command lists and verifies the S3 root.

Usage: .venv/bin/python tools/wheel_smoke.py WHEEL...
(run by the project's .venv, which has the servers; exit 1 on a failure)
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing"))
import object_store_server  # noqa: E402

CHECK = r"""
import os, sys
import numpy as np
import hoist
heavy = [m for m in ("torch", "jax", "pyarrow") if m in sys.modules]
assert not heavy, f"import hoist imported {heavy}"
state = {"w": np.random.default_rng(1).standard_normal((300, 70)),
         "i": np.arange(12345, dtype=np.int32)}
for root in sys.argv[1:]:
    with hoist.CheckpointManager(root, keep=2) as mgr:
        mgr.save(5, state).wait()
        back = mgr.restore(like=state)
        assert all(np.array_equal(back[k], state[k]) for k in state), root
        assert mgr.verify(5) == [], root
    print("restored bit-exact from", root)
"""


def python_for(wheel):
    tag = re.search(r"-cp3(\d+)-", wheel.name)[1]
    for p in sorted(Path("/root/.pyenv/versions").glob(f"3.{tag}.*")):
        exe = p / "bin" / f"python3.{tag}"
        if exe.exists():
            return str(exe)
    return f"python3.{tag}"


def main(wheels):
    if not wheels:
        sys.exit(__doc__)
    failed = []
    with tempfile.TemporaryDirectory() as tmp, \
            object_store_server.S3Server(Path(tmp) / "s3") as s3, \
            object_store_server.GcsServer(Path(tmp) / "gcs") as gcs:
        for wheel in map(Path, wheels):
            venv = Path(tmp) / wheel.name.split("-")[2]
            print(f"--- {wheel.name}", flush=True)
            subprocess.run([python_for(wheel), "-m", "venv", venv], check=True)
            subprocess.run([venv / "bin" / "pip", "install", "-q",
                            "--disable-pip-version-check",
                            f"{wheel}[s3]"], check=True)
            roots = [str(Path(tmp) / f"posix-{venv.name}"),
                     f"s3://{s3.bucket}/{venv.name}",
                     f"gs://{gcs.bucket}/{venv.name}"]
            env = dict(os.environ, **s3.env, **gcs.env)
            ok = subprocess.run([venv / "bin" / "python", "-c", CHECK, *roots],
                                env=env).returncode == 0
            for command in (["ls", roots[1]], ["verify", roots[1]]):
                ok = ok and subprocess.run([venv / "bin" / "hoist", *command],
                                           env=env).returncode == 0
            if not ok:
                failed.append(wheel.name)
    if failed:
        sys.exit(f"wheel_smoke: FAILED: {', '.join(failed)}")
    print(f"wheel_smoke: {len(wheels)} wheels installed and used")


if __name__ == "__main__":
    main(sys.argv[1:])
