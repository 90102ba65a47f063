"""One rank of a training job that a scheduler preempts with SIGTERM: under
torchrun (gloo), or as one of several jax.distributed processes (CPU
backend). test_preemption.py starts it.

  preempt_worker.py torch ROOT OUT [LOCAL_ROOT]
  preempt_worker.py jax PORT PROCESS NPROC ROOT OUT [LOCAL_ROOT]

Each rank resumes from the newest step the root (or LOCAL_ROOT, a local
tier) holds, if any, checking that it holds exactly the state of that
step, then trains: every step adds every rank's gradient (an all-reduce)
to a sharded weight and a replicated one, and asks the manager whether
the job is preempted. Once the loop has run a few steps it writes
"hoist-ready RANK PID" on stdout; the test then sends SIGTERM to some or
all ranks. With HOIST_TEST_RESUME_ONLY=1 a rank stops after its resume's
check instead, writing OUT.RANK.json. At the
agreed step each rank saves, waits for the commit, writes OUT.RANK.json
(the step, the save's tier, when the signal came and when the save had
committed, from a handler of the job's own that hoist chains to) and
exits 0. A rank that is never preempted gives up after 120 s (exit 3).
"""
import json
import os
import signal
import sys
import time

import numpy as np

KIND = sys.argv[1]
if KIND == "jax":
    PORT, PROCESS, NPROC = (int(a) for a in sys.argv[2:5])
    ROOT, OUT = sys.argv[5:7]
    LOCAL = sys.argv[7] if len(sys.argv) > 7 else None
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
else:
    ROOT, OUT = sys.argv[2:4]
    LOCAL = sys.argv[4] if len(sys.argv) > 4 else None

# The job's own SIGTERM handler, installed before the manager opens: hoist
# calls it after noting the signal.
SIGNALLED = []
signal.signal(signal.SIGTERM, lambda *_: SIGNALLED.append(time.time()))

import hoist  # noqa: E402

ROWS, COLS = 64, 32


def initial():
    """The weights before step 0, the same on every rank."""
    w = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    return w, np.full((COLS,), 0.5, np.float32)


def expected(step, world):
    """The weights after steps 0..step: each step adds 1 + 2 + ... + world."""
    w, b = initial()
    grown = (step + 1) * world * (world + 1) / 2
    return w + grown, b + grown


class Weights:
    """A job's weights, "w" (sharded) and "b" (replicated), as a state."""

    def state(self):
        return {"model": {"w": self.w, "b": self.b}}

    def load(self, restored):
        self.w = restored["model"]["w"]
        self.b = restored["model"]["b"]


class TorchJob(Weights):
    def __init__(self):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor import distribute_tensor
        dist.init_process_group("gloo")
        self.torch, self.dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (self.world,))
        w, b = initial()
        self.w = distribute_tensor(torch.from_numpy(w), mesh, [Shard(0)])
        self.b = distribute_tensor(torch.from_numpy(b), mesh, [Replicate()])

    def train_step(self):
        g = self.torch.tensor([float(self.rank + 1)])
        self.dist.all_reduce(g)
        self.w.to_local().add_(g)
        self.b.to_local().add_(g)

    def full(self):
        return (self.w.full_tensor().numpy(), self.b.full_tensor().numpy())


class JaxJob(Weights):
    def __init__(self):
        import jax
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{PORT}", NPROC, PROCESS)
        from jax.sharding import NamedSharding, PartitionSpec as P
        self.jax = jax
        self.rank, self.world = jax.process_index(), jax.process_count()
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
        self.sharded = NamedSharding(mesh, P("x"))
        self.replicated = NamedSharding(mesh, P())
        w, b = initial()
        self.w = jax.device_put(w, self.sharded)
        self.b = jax.device_put(b, self.replicated)
        ranks = jax.device_put(
            np.repeat(np.arange(1, self.world + 1, dtype=np.float32),
                      jax.local_device_count()), self.sharded)
        # Every process's gradient summed over the job: a collective.
        per_device = jax.local_device_count()
        self.gradient = jax.jit(lambda r: r.sum() / per_device)(ranks)

    def train_step(self):
        self.w = self.jax.jit(lambda w, g: w + g)(self.w, self.gradient)
        self.b = self.jax.jit(lambda b, g: b + g)(self.b, self.gradient)
        self.w.block_until_ready()

    def full(self):
        from jax.experimental import multihost_utils
        return tuple(np.asarray(multihost_utils.process_allgather(
            a, tiled=True)) for a in (self.w, self.b))


def main():
    job = TorchJob() if KIND == "torch" else JaxJob()
    mgr = hoist.CheckpointManager(
        ROOT, pool_bytes=16 << 20, preemption_signals=(signal.SIGTERM,),
        preemption_deadline_s=20, preemption_poll_s=0.2,
        local_root=LOCAL, persist_every=1 if LOCAL is None else 1000,
        coordinator_timeout_s=60)
    start, resumed = 0, None
    try:  # the newest step either tier holds
        job.load(mgr.restore(like=job.state()))
    except FileNotFoundError:
        pass
    else:
        latest = mgr.last_restore["step"]
        w, b = job.full()
        want_w, want_b = expected(latest, job.world)
        if not (np.array_equal(w, want_w) and np.array_equal(b, want_b)):
            raise SystemExit(f"rank {job.rank}: step {latest} restored "
                             "other values than it saved")
        start, resumed = latest + 1, latest
    if os.environ.get("HOIST_TEST_RESUME_ONLY"):
        mgr.close()
        with open(f"{OUT}.{job.rank}.json", "w") as f:
            json.dump({"resumed": resumed}, f)
        return 0
    began = time.time()
    for step in range(start, 10**9):
        job.train_step()
        if step == start + 3:
            print(f"hoist-ready {job.rank} {os.getpid()}", flush=True)
        if mgr.reached_preemption(step):
            info = mgr.save(step, job.state()).wait()
            committed = time.time()
            mgr.close()
            with open(f"{OUT}.{job.rank}.json", "w") as f:
                json.dump({"step": step, "tier": info["tier"],
                           "resumed": resumed,
                           "signalled": SIGNALLED[0] if SIGNALLED else None,
                           "committed": committed}, f)
            return 0
        if time.time() - began > 120:
            return 3
    return 3


if __name__ == "__main__":
    code = main()
    if KIND == "jax" and code == 0:
        # Process 0 hosts the coordination service, and a process that
        # loses it aborts: the shutdown barrier lets every process write
        # its outcome before process 0 exits.
        import jax
        jax.distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Past the teardown's gloo threads (see outcome.exit_without_teardown).
    os._exit(code)
