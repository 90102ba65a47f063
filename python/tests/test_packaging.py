"""The installed package as a user meets it: the `hoist` command and
`python -m hoist` run the CLI, the version is one, and without pyarrow
`import hoist`, the CLI and POSIX roots work while an s3:// or gs:// root
says how to get object storage (the object stores are a module loaded at
the first such root: src/hoist/io/object_store/object_store_plugin.h)."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import hoist

PACKAGE = Path(hoist.__file__).resolve().parent
BIN = Path(sys.executable).parent
CMAKELISTS = Path(__file__).resolve().parents[2] / "CMakeLists.txt"


def test_the_version_is_cmakes_everywhere():
    line = next(l for l in CMAKELISTS.read_text().splitlines()
                if l.startswith("project(hoist VERSION "))
    version = line.split()[2]
    assert hoist.__version__ == version
    from importlib.metadata import version as dist_version
    assert dist_version("hoist-checkpoint") == version
    out = subprocess.run([BIN / "hoist", "--version"], check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == f"hoist {version}"


def test_python_m_hoist_is_the_cli(tmp_path):
    root = tmp_path / "r"
    subprocess.run([sys.executable, "-m", "hoist", "demo", "--size", "4MiB",
                    "--vocab", "256", "--steps", "2", "--step-time", "0ms",
                    "--root", str(root)], check=True, capture_output=True)
    ls = subprocess.run([BIN / "hoist", "ls", str(root)], check=True,
                        capture_output=True, text=True).stdout
    assert "2" in ls
    bad = subprocess.run([BIN / "hoist", "ls"], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "ROOT is required" in bad.stderr


def test_without_pyarrow_posix_works_and_object_stores_say_why(tmp_path):
    # The package alone on sys.path, with no pyarrow beside it: the
    # object-store module's $ORIGIN/../pyarrow finds nothing.
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "hoist",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = textwrap.dedent(f"""
        import sys
        sys.modules["pyarrow"] = None  # `import pyarrow` fails here
        import numpy as np
        import hoist
        assert hoist.__file__.startswith({str(site)!r}), hoist.__file__
        mgr = hoist.CheckpointManager({str(tmp_path / "ckpt")!r})
        state = {{"w": np.arange(1000, dtype=np.float32)}}
        mgr.save(1, state).wait()
        back = mgr.restore(like=state)
        assert (back["w"] == state["w"]).all()
        mgr.close()
        for root in ("s3://bucket/run", "gs://bucket/run"):
            try:
                hoist.CheckpointManager(root)
            except Exception as e:
                assert "pip install 'hoist-checkpoint[s3]'" in str(e), e
                assert "libarrow" in str(e), e
            else:
                raise AssertionError(root + " opened without pyarrow")
        print("ok")
        """)
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", script], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    cli = subprocess.run([site / "hoist" / "_hoist_cli", "ls",
                          "s3://bucket/run"], capture_output=True, text=True)
    assert cli.returncode == 1
    assert "pip install 'hoist-checkpoint[s3]'" in cli.stderr, cli.stderr
    listed = subprocess.run([site / "hoist" / "_hoist_cli", "ls",
                             str(tmp_path / "ckpt")], capture_output=True,
                            text=True)
    assert listed.returncode == 0 and "1" in listed.stdout, listed.stderr


COMMON_SH = Path(__file__).resolve().parents[2] / "tools" / "common.sh"


def _scripts_run(venv):
    return subprocess.run(
        ["bash", "-c", f'source "{COMMON_SH}" && venv_scripts_run "$1"',
         "bash", str(venv)], capture_output=True, text=True).returncode


def test_the_virtualenvs_scripts_name_an_interpreter_that_exists(tmp_path):
    # The virtualenv running this test (shared by clones: tools/common.sh):
    # torchrun, accelerate and the rest are launched by path, so each must
    # name an interpreter that outlives the clone that installed it.
    assert _scripts_run(Path(sys.prefix)) == 0
    # The check itself: a script naming a missing interpreter fails it.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    good = venv / "bin" / "good"
    good.write_text(f"#!{sys.executable}\nprint('ok')\n")
    assert _scripts_run(venv) == 0
    bad = venv / "bin" / "torchrun"
    bad.write_text(f"#!{tmp_path}/gone/.venv/bin/python\nprint('no')\n")
    assert _scripts_run(venv) == 1
