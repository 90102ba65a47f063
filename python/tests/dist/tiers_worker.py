"""One rank of a job that saves to the local tier and recovers from it
(run by test_tiers.py): under torchrun (DTensors on a 2 x 2 data x model
mesh, gloo) or as one of several jax.distributed processes (global arrays,
CPU backend).

  tiers_worker.py torch save ROOT LOCAL STEPS
  tiers_worker.py torch save_kill ROOT LOCAL STEPS
  tiers_worker.py torch restore ROOT LOCAL OUT
  tiers_worker.py jax PORT PROCESS NPROC save ROOT LOCAL STEPS
  tiers_worker.py jax PORT PROCESS NPROC restore ROOT LOCAL OUT
  tiers_worker.py torch read_once ROOT - OUT
  tiers_worker.py torch ranks_save ROOT - -
  tiers_worker.py torch ranks_restore ROOT - SAVED_WORLD

Under torchrun, several PHASE ROOT LOCAL LAST groups run one after the
other in the one job (a launch costs more than a phase here).

save: steps 1..STEPS, each to the local tier (local every step, the
extents of its part no other process holds sent to one peer: "opt"'s, not
"w"'s) and every 4th to the durable root. save_kill: the same,
then step STEPS + 1 is saved, and while it is in flight rank 1's node dies:
its local root is removed and its process SIGKILLed. restore: the newest
step either tier can rebuild; every rank checks its shards bit-exact and
rank 0 writes the restore's figures to OUT. Step s's arrays come from seed
s, so every rank knows what its shards must hold; each rank's RNG states
and data position (hoist.PerRank) come from its rank and the step.
read_once: a durable step restored with shared reads (each byte read once
per job) and without (each rank reads all it needs); rank 0 writes both
restores' bytes read and received, summed over the ranks, to OUT.
ranks_save / ranks_restore: per-rank state alone (durable root only),
restored on as many ranks as saved it (each its own), or on another
number (ValueError; per_rank="all" gives every saved rank's).
"""
import json
import os
import shutil
import signal
import sys

FRAMEWORK = sys.argv[1]
if FRAMEWORK == "jax":
    PORT, PROCESS, NPROC = (int(a) for a in sys.argv[2:5])
    ARGS = sys.argv[5:]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
else:
    ARGS = sys.argv[2:]

import numpy as np  # noqa: E402

import hoist  # noqa: E402


def full(step):
    """name -> the full array of `step`."""
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((16, 8)).astype(np.float32),
            "opt": rng.standard_normal((12, 10)).astype(np.float32)}


class Loader:
    """A data loader's position: a stateful object, as StatefulDataLoader."""

    def __init__(self, position=0):
        self.position = position

    def state_dict(self):
        return {"position": self.position, "epoch": 1}

    def load_state_dict(self, state):
        self.position = state["position"]


def ranked(rank, step):
    """This rank's per-rank state at `step`: RNG states and a loader."""
    import random
    random.seed(100 * rank + step)
    np.random.seed(100 * rank + step)
    out = {"python": random.getstate(), "numpy": np.random.get_state()}
    if FRAMEWORK == "torch":
        import torch
        torch.manual_seed(100 * rank + step)
        out["torch"] = torch.get_rng_state()
    return {"rng": hoist.PerRank(out),
            "data": hoist.PerRank(Loader(1000 * rank + step))}


def check_ranked(restored, rank, step):
    expected = ranked(rank, step)
    got, want = restored["rng"], expected["rng"].value
    assert got["python"] == want["python"], rank
    assert got["numpy"][1].tobytes() == want["numpy"][1].tobytes(), rank
    if FRAMEWORK == "torch":
        assert got["torch"].equal(want["torch"]), rank
    assert restored["data"].position == 1000 * rank + step, (
        rank, restored["data"].position)


def all_ranks(value):
    """Every rank's `value` (an int), in rank order."""
    if FRAMEWORK == "jax":
        from jax.experimental import multihost_utils
        return [int(v) for v in multihost_utils.process_allgather(
            np.array(value, dtype=np.int64))]
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def manager(root, local):
    return hoist.CheckpointManager(root, pool_bytes=8 << 20, persist_every=4,
                                   local_root=os.path.join(local, "{rank}"),
                                   local_every=1, replicas=2)


def torch_state(step):
    """w: sharded over "model", replicated over "data" (a data-parallel
    replica holds each box twice); opt: sharded over both."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "model"))
    arrays = full(step)
    return {"w": distribute_tensor(torch.from_numpy(arrays["w"]), mesh,
                                   [Replicate(), Shard(1)]),
            "opt": distribute_tensor(torch.from_numpy(arrays["opt"]), mesh,
                                     [Shard(0), Shard(1)]),
            "step": step}


def jax_state(step):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, -1),
                             ("data", "model"))
    arrays = full(step)
    out = {}
    for name, spec in (("w", P(None, "model")), ("opt", P("data", "model"))):
        sharding = NamedSharding(mesh, spec)
        out[name] = jax.make_array_from_callback(
            arrays[name].shape, sharding, lambda index, a=arrays[name]: a[index])
    out["step"] = step
    return out


def local_shards(array):
    """(index, NumPy data) of this process's shards of a DTensor or a
    jax.Array."""
    if FRAMEWORK == "jax":
        return [(s.index, np.asarray(s.data)) for s in array.addressable_shards]
    from torch.distributed.tensor._utils import (
        compute_local_shape_and_global_offset)
    shape, offset = compute_local_shape_and_global_offset(
        array.shape, array.device_mesh, array.placements)
    index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    return [(index, array.to_local().numpy())]


def main():
    if not ARGS or len(ARGS) % 4 or (FRAMEWORK == "jax" and len(ARGS) != 4):
        sys.exit(f"usage: see {__doc__}")
    if FRAMEWORK == "jax":
        import jax
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{PORT}", NPROC, PROCESS)
        make, rank = jax_state, jax.process_index()
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        make, rank = torch_state, dist.get_rank()
    for at in range(0, len(ARGS), 4):
        phase, root, local, last = ARGS[at:at + 4]
        if phase.startswith("ranks_"):
            ranks(phase, root, rank, last)
        elif phase == "read_once":
            read_once(root, rank, last, make)
        else:
            tiers(phase, root, local, last, make, rank)
    if FRAMEWORK == "torch":
        import outcome  # beside this script
        outcome.exit_without_teardown()


def ranks(phase, root, rank, saved_world):
    import torch.distributed as dist
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        if phase == "ranks_save":
            mgr.save(1, {"w": np.arange(4.0), **ranked(rank, 1)}).wait()
            return
        template = {"w": np.zeros(4), "rng": hoist.PerRank({}),
                    "data": hoist.PerRank(Loader())}
        if int(saved_world) == dist.get_world_size():
            check_ranked(mgr.restore(like=template), rank, 1)
            return
        try:
            mgr.restore(like=template)
            raise AssertionError("a restore on another world size passed")
        except ValueError as error:
            assert "per_rank='all'" in str(error), error
        every = mgr.restore(like=template, per_rank="all")
        assert [d["position"] for d in every["data"]] == [
            1000 * r + 1 for r in range(int(saved_world))], every["data"]


def read_once(root, rank, out, make):
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, make(1)).wait()
    figures = {}
    for shared in (True, False):
        with hoist.CheckpointManager(root, pool_bytes=8 << 20,
                                     shared_reads=shared) as mgr:
            restored = mgr.restore(like=make(0))
            expected = full(1)
            for name in ("w", "opt"):
                for index, data in local_shards(restored[name]):
                    assert data.tobytes() == expected[name][index].tobytes()
            figures["shared" if shared else "separate"] = {
                key: sum(all_ranks(mgr.last_restore[key]))
                for key in ("bytes_read", "bytes_received")}
    figures["unique"] = sum(a.nbytes for a in full(1).values())
    if rank == 0:
        with open(out, "w") as f:
            json.dump(figures, f)


def tiers(phase, root, local, last, make, rank):
    with manager(root, local) as mgr:
        if phase in ("save", "save_kill"):
            tiers = []
            for step in range(1, int(last) + 1):
                state = make(step)
                handle = mgr.save(step, {**state, **ranked(rank, step)})
                info = handle.wait()
                tiers.append((handle.tier, info["tier"]))
                if handle.tier == "local":
                    # Only "opt" went to the replica holder: every box of
                    # "w" (and the step) has a second holder already.
                    opt = sum(d.nbytes for _, d in local_shards(state["opt"]))
                    assert handle.replicated_bytes == opt, (
                        handle.replicated_bytes, opt)
            assert tiers[3] == ("durable", "durable"), tiers
            assert all(t == ("local", "local") for i, t in enumerate(tiers)
                       if i != 3), tiers
        if phase == "save_kill":
            step = int(last) + 1
            mgr.save(step, {**make(step), **ranked(rank, step)})
            if rank == 1:
                # The storage goes at once (moved away: its saver thread
                # may be writing into it), then the process.
                lost = os.path.join(os.path.dirname(local), "lost-1")
                os.rename(os.path.join(local, "1"), lost)
                shutil.rmtree(lost, ignore_errors=True)
                with open(os.path.join(os.path.dirname(local), "killed"),
                          "w") as f:
                    f.write(f"rank 1 at step {step}")
                os.kill(os.getpid(), signal.SIGKILL)
            # The others wait for a step that cannot complete, until
            # torchrun stops them.
            mgr.wait_until_finished()
            raise AssertionError(f"step {step} completed without rank 1")
        elif phase == "restore":
            template = {**make(0), "rng": hoist.PerRank({}),
                        "data": hoist.PerRank(Loader())}
            restored = mgr.restore(like=template)
            figures = mgr.last_restore
            step = restored["step"]
            assert figures["step"] == step, (figures, step)
            expected = full(step)
            for name in ("w", "opt"):
                for index, data in local_shards(restored[name]):
                    assert data.tobytes() == expected[name][index].tobytes(), (
                        name, index)
            check_ranked(restored, rank, step)
            figures["received_by_rank"] = all_ranks(figures["bytes_received"])
            if rank == 0:
                with open(last, "w") as f:
                    json.dump(figures, f)


if __name__ == "__main__":
    main()
