"""One rank of a torchrun job that saves or restores DTensor state with hoist
(run by test_multiprocess.py under `torchrun --nproc-per-node N`).

  torch_worker.py COMMAND ARGS... [-- COMMAND ARGS...]

runs each command in turn in the one job (kill and hang end it):

  save ROOT STEP LAYOUT       save the reference state
  restore ROOT STEP [SAVE]    restore it onto each layout, check; then
                              save step SAVE
  dcp DIR LAYOUT              save the reference state with
                              torch.distributed.checkpoint
  metrics ROOT FILE OUT       three saves appending their phases to FILE;
                              each rank's wait() results to OUT.RANK.json
  train ROOT END RUN          one of torch_train.py's runs (FSDP2)
  kill ROOT OUT               rank 1 dies mid-save; rank 0 writes what it
                              saw to OUT
  hang ROOT OUT               rank 1 stops mid-save (SIGSTOP); the same
  float8 ROOT                 torchao's float8 training weights under
                              FSDP2 (float8 all-gather) saved and restored
                              into a fresh model, bit-exact; a DTensor of
                              float8 data and its scale refused, named

LAYOUT names the placements of every array ("a" or "b"), so a restore can
use other placements than the save, on any number of ranks. The reference
state's full tensors are made from fixed seeds, so every rank of every job
knows what each shard must hold.
"""
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (DTensor, Replicate, Shard,
                                      distribute_tensor)

import hoist
import outcome  # beside this script


def full_tensors():
    """name -> the full tensor every layout shards."""
    g = torch.Generator().manual_seed(1234)
    return {
        "w": torch.randn(13, 6, generator=g),             # uneven rows
        "tiny": torch.randn(3, generator=g),              # empty shards at 4
        "col": torch.randn(5, 9, generator=g).to(torch.bfloat16),
        "rep": torch.randn(4, 4, generator=g),
        "grid": torch.randn(10, 7, generator=g),          # on a 2-D mesh
        "plain": torch.arange(100, dtype=torch.int64),    # not a DTensor
    }


def placements(layout):
    """name -> (mesh dimensions, placements) of `layout`."""
    if layout == "a":
        return {"w": (1, [Shard(0)]), "tiny": (1, [Shard(0)]),
                "col": (1, [Shard(1)]), "rep": (1, [Replicate()]),
                "grid": (2, [Shard(0), Shard(1)])}
    return {"w": (1, [Shard(1)]), "tiny": (1, [Replicate()]),
            "col": (1, [Shard(0)]), "rep": (1, [Shard(0)]),
            "grid": (2, [Shard(1), Replicate()])}


def meshes():
    world = dist.get_world_size()
    rows = 2 if world % 2 == 0 else 1
    return {1: init_device_mesh("cpu", (world,)),
            2: init_device_mesh("cpu", (rows, world // rows))}


def state(layout):
    """The reference state in `layout`: DTensors in nested dicts, a plain
    tensor (the same on every rank) and a scalar."""
    full, mesh = full_tensors(), meshes()
    model = {name: distribute_tensor(full[name], mesh[dims], places)
             for name, (dims, places) in placements(layout).items()}
    return {"model": model, "plain": full["plain"], "epoch": 3}


def check(restored, layout):
    """Raises unless `restored` holds exactly the reference state's shards
    in `layout`."""
    expected = state(layout)
    for name, want in expected["model"].items():
        got = restored["model"][name]
        assert type(got).__name__ == "DTensor", (name, type(got))
        assert got.placements == want.placements, (name, got.placements)
        assert got.device_mesh == want.device_mesh, name
        assert torch.equal(got.to_local(), want.to_local()), name
        assert torch.equal(got.full_tensor(), want.full_tensor()), name
    assert torch.equal(restored["plain"], expected["plain"])
    assert restored["epoch"] == 3


def extents_needed(manifest, template):
    """How many of the step's extents meet this rank's shards of
    `template`: all a restore may read."""
    from hoist._tree import _dtensor_boxes
    saved = {a["name"]: a for a in manifest["arrays"]}
    count = 0
    for name, like in template["model"].items():
        boxes = _dtensor_boxes(name, tuple(like.shape), like.device_mesh,
                               like.placements)
        origin, shape = boxes[dist.get_rank()]
        for extent in saved[f"model/{name}"]["extents"]:
            o, s = extent["box"]["origin"], extent["box"]["shape"]
            if all(a < c + d and c < a + b
                   for a, b, c, d in zip(origin, shape, o, s)):
                count += 1
    return count + len(saved["plain"]["extents"])


def save(root, step, layout):
    with hoist.CheckpointManager(root, pool_bytes=64 << 20) as mgr:
        assert mgr.rank == dist.get_rank()
        mgr.save(int(step), state(layout)).wait()


def restore(root, step, save_step=None):
    """Onto every layout, checked; then, maybe, a save of `save_step`."""
    step = int(step)
    with hoist.CheckpointManager(root, pool_bytes=64 << 20) as mgr:
        for layout in "ab":
            template = state(layout)
            restored = mgr.restore(step, like=template)
            check(restored, layout)
            needed = extents_needed(
                hoist.inspect(f"{root}/step_{step:08d}"), template)
            assert mgr.last_restore["extents_read"] == needed, (
                mgr.last_restore, needed)
        # Without a template: every rank gets the full tensors.
        whole = mgr.restore(step)
        full = full_tensors()
        for name in placements("a"):
            assert torch.equal(whole["model"][name], full[name]), name
        if save_step is not None:
            mgr.save(int(save_step), state("a")).wait()


def metrics(root, path, out):
    """Three saves, their phases appended to `path`."""
    with hoist.CheckpointManager(root, pool_bytes=64 << 20, keep=2,
                                 metrics_path=path) as mgr:
        infos = [mgr.save(step, state("a")).wait() for step in (1, 2, 3)]
    with open(f"{out}.{dist.get_rank()}.json", "w") as f:
        json.dump(infos, f)


def dcp_save(directory, layout):
    """The checkpoint a DCP job has, to import."""
    import torch.distributed.checkpoint as dcp
    dcp.save(state(layout), checkpoint_id=directory)


def train(root, end, spec):
    """torch_train.py's run: FSDP2 training, saved or resumed by hoist."""
    import torch_train  # beside this script
    torch_train.run(root, end=int(end), **json.loads(spec))


def kill(root, out):
    rank = dist.get_rank()
    # torchrun ends the survivors (SIGTERM, SIGKILL 30 s later) at its
    # next look (every 0.5 s) after rank 1 dies: rank 0 stays to report
    # what its save saw, which on a loaded machine may take longer.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Big enough that rank 1 dies while its share is being written.
    big = {"big": torch.ones(16 << 20, dtype=torch.float32)}
    mgr = hoist.CheckpointManager(root, pool_bytes=256 << 20,
                                  coordinator_timeout_s=60)
    mgr.save(1, state("a")).wait()
    handle = mgr.save(2, {**state("a"), **big})
    if rank == 1:  # dies once its share of step 2 is staged: in the
        # save's first collective, or while its share is written
        os.kill(os.getpid(), signal.SIGKILL)
    outcome.report(mgr, handle, out)
    os._exit(0)  # the job lost a rank: skip torch's teardown


def hang(root, out):
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    mgr = hoist.CheckpointManager(root, pool_bytes=256 << 20,
                                  coordinator_timeout_s=5)
    mgr.save(1, state("a")).wait()
    # Big enough that rank 1 stops while its share is being written.
    big = {"big": torch.ones(16 << 20, dtype=torch.float32)}
    handle = mgr.save(2, {**state("a"), **big})
    if dist.get_rank() == 1:  # stops (alive, silent) once its share is
        # staged: in the save's first collective, or before it is written
        os.kill(os.getpid(), signal.SIGSTOP)
    outcome.report(mgr, handle, out)
    os.kill(pids[1], signal.SIGKILL)
    os._exit(0)


def _float8_model(mesh):
    from torch.distributed.fsdp import fully_shard
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    model = torch.nn.Sequential(torch.nn.Linear(32, 64),
                                torch.nn.Linear(64, 16))
    convert_to_float8_training(model, config=Float8LinearConfig(
        enable_fsdp_float8_all_gather=True))
    fully_shard(model, mesh=mesh)
    return model


def float8(root):
    """DTensors of torchao's float8 weight wrapper round-trip bit-exactly;
    a DTensor whose local tensor is float8 data and a scale is refused."""
    from torchao.float8.float8_scaling_utils import \
        hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import (GemmInputRole,
                                                       LinearMMConfig)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(1)
    model = _float8_model(mesh)
    fresh = _float8_model(mesh)
    weight = model.state_dict()["0.weight"]
    assert type(weight.to_local()).__name__ == \
        "WeightWithDynamicFloat8CastTensor", type(weight.to_local())
    with hoist.CheckpointManager(root, pool_bytes=16 << 20) as mgr:
        mgr.save(1, {"model": model.state_dict()}).wait()
        fresh.load_state_dict(
            mgr.restore(1, like={"model": fresh.state_dict()})["model"])
        for (key, a), b in zip(model.state_dict().items(),
                               fresh.state_dict().values()):
            a, b = (getattr(t.to_local(), "_tensor", t.to_local())
                    for t in (a, b))
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), key
        local = hp_tensor_to_float8_dynamic(
            torch.randn(8, 16), torch.float8_e4m3fn, LinearMMConfig(),
            gemm_input_role=GemmInputRole.WEIGHT)
        scaled = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        try:
            mgr.save(2, {"opt": {"w": scaled}}).wait()
            raise AssertionError("a DTensor of float8 data was saved")
        except TypeError as error:
            assert "array 'opt/w' is a torchao.float8" in str(error), error
        assert mgr.steps == [1], mgr.steps


COMMANDS = {"save": save, "restore": restore, "metrics": metrics,
            "dcp": dcp_save, "train": train, "kill": kill, "hang": hang,
            "float8": float8}


def main():
    """Runs each COMMAND ARGS... in turn (separated by "--") in this one
    job: a launch costs more than most commands here."""
    words, commands = sys.argv[1:], [[]]
    for word in words:
        if word == "--":
            commands.append([])
        else:
            commands[-1].append(word)
    for command in commands:
        if not command or command[0] not in COMMANDS:
            sys.exit(f"unknown command {command}; usage: see {__doc__}")
    dist.init_process_group("gloo")
    for name, *args in commands:
        COMMANDS[name](*args)
    dist.destroy_process_group()
    outcome.exit_without_teardown()


if __name__ == "__main__":
    main()
