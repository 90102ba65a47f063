"""A PyTorch/XLA SPMD training job on torch_xla's CPU client (8 devices, a
4 x 2 mesh), run by test_torch_xla.py with .venv-xla's interpreter.

  torch_xla_worker.py train ROOT OUT STEPS KILL_AT
      The uninterrupted job to STEPS (its weights after every step go to
      OUT.ref.pt), then the same job from scratch saving every step with
      hoist, killed (os._exit, no close) while the save of step KILL_AT is
      in flight. OUT.train.json: each save's wait() figures.
  torch_xla_worker.py resume ROOT OUT STEPS
      Restores the newest committed step onto the transposed 2 x 4 mesh
      and checks it against the reference, then onto the job's own
      sharding, trains to STEPS and checks every weight bit for bit against
      the uninterrupted job. OUT.resume.json: what it saw.

Exits non-zero, saying why, on any difference.
"""
import json
import os
import sys

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

import hoist

xr.use_spmd()
DEVICE = torch_xla.device()
MESH = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
OTHER = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
BATCH, WIDTH = 16, 24


def model_and_optimizer(mesh):
    """A 3-layer MLP whose weights are sharded on `mesh` (rows over "model",
    a bias over "data", one uneven split), and SGD with momentum."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 40), torch.nn.ReLU(),
        torch.nn.Linear(40, 10), torch.nn.ReLU(),  # 10 rows over 4: uneven
        torch.nn.Linear(10, 1)).to(DEVICE)
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[0].bias, mesh, ("data",))
    xs.mark_sharding(model[2].weight, mesh, ("data", "model"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer


def train_step(model, optimizer, step):
    data = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, WIDTH, generator=data).to(DEVICE)
    y = torch.randn(BATCH, 1, generator=data).to(DEVICE)
    xs.mark_sharding(x, MESH, ("data", None))
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    torch_xla.sync()


def weights(model):
    return {k: v.cpu() for k, v in model.state_dict().items()}


def state(model, optimizer, step):
    """What the job saves: state dicts, so that every save after the first
    takes hoist's repeat path (the same structure, new values)."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "step": step}


def train(root, out, steps, kill_at):
    model, optimizer = model_and_optimizer(MESH)
    reference = []
    for step in range(steps):
        train_step(model, optimizer, step)
        reference.append(weights(model))
    torch.save(reference, f"{out}.ref.pt")

    model, optimizer = model_and_optimizer(MESH)
    figures = []
    mgr = hoist.CheckpointManager(root, pool_bytes=8 << 20)
    repeats, again = [], mgr._save_again  # which saves took the repeat path

    def spy(*args):
        handle = again(*args)
        repeats.append(handle is not None)
        return handle

    mgr._save_again = spy
    for step in range(steps):
        train_step(model, optimizer, step)
        handle = mgr.save(step, state(model, optimizer, step))
        if step == kill_at:  # killed while this save is in flight
            with open(f"{out}.train.json", "w") as f:
                json.dump(figures, f)
            os._exit(0)
        info = handle.wait()
        figures.append({k: info[k] for k in (
            "xla_transfer_calls", "xla_shards", "pjrt_transfer_calls")})
        figures[-1]["repeat"] = repeats[-1]
    raise SystemExit("the job was not killed")


def check(got, want, what):
    for key, value in want.items():
        if not torch.equal(got[key].cpu(), value):
            raise SystemExit(f"{what}: '{key}' differs")


def pending_computation_syncs_once(mgr, step):
    """Saves three tensors whose values are not yet computed: the graph
    executions the save ran (torch_xla's metrics), which must be one."""
    import torch_xla.debug.metrics as metrics

    def executions():
        data = metrics.metric_data("ExecuteReplicatedTime")
        return data[0] if data else 0

    base = torch.arange(64, dtype=torch.float32).reshape(8, 8).to(DEVICE)
    xs.mark_sharding(base, MESH, ("data", "model"))
    torch_xla.sync()
    lazy = {"a": base + 1, "b": base * 2, "c": (base - 3).sum(0)}
    before = executions()
    mgr.save(step, lazy).wait()
    ran = executions() - before
    restored = mgr.restore(step, names=["a", "b", "c"])
    check(restored, {k: v.cpu() for k, v in lazy.items()}, "lazy tensors")
    return ran


def resume(root, out, steps):
    reference = torch.load(f"{out}.ref.pt")
    seen = {}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        # Onto another mesh: the same values, the template's sharding.
        model, optimizer = model_and_optimizer(OTHER)
        other = mgr.restore(like={"model": model.state_dict()})["model"]
        step = mgr.last_restore["step"]
        check(other, reference[step], f"step {step} on the 2 x 4 mesh")
        spec = torch_xla._XLAC._get_xla_sharding_spec
        seen["other_specs"] = {k: spec(v) for k, v in other.items()}
        seen["template_specs"] = {
            k: spec(v) for k, v in model.state_dict().items()}
        # Onto the job's own sharding (a step of training makes the
        # optimizer's momentum buffers, which the template then has), then
        # on to the end.
        model, optimizer = model_and_optimizer(MESH)
        train_step(model, optimizer, 0)
        restored = mgr.restore(step, like=state(model, optimizer, 0))
        model.load_state_dict(restored["model"])
        optimizer.load_state_dict(restored["optimizer"])
        seen["momentum_on"] = str(
            restored["optimizer"]["state"][0]["momentum_buffer"].device)
        seen["resumed"] = restored["step"]
        for later in range(restored["step"] + 1, steps):
            train_step(model, optimizer, later)
        check(weights(model), reference[steps - 1], "the resumed job's end")
        seen["syncs"] = pending_computation_syncs_once(mgr, steps)
        try:  # a template of another shape: named, before anything is read
            mgr.restore(step, like={"model": {
                "0.weight": torch.zeros(40, 23).to(DEVICE)}})
            raise SystemExit("a template of another shape was restored")
        except ValueError as error:
            seen["wrong_shape"] = str(error)
    with open(f"{out}.resume.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    command, root, out, steps = sys.argv[1:5]
    if command == "train":
        train(root, out, int(steps), int(sys.argv[5]))
    else:
        resume(root, out, int(steps))
