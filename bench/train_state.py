#!/usr/bin/env python3
"""Time blocked saving a flax TrainState (optax AdamW) against the same arrays
as plain dicts.

    .venv/bin/python bench/train_state.py [--size 512MiB] [--rounds 7]

hoist walks a registered JAX pytree (TrainState, optax's namedtuple states)
through JAX's own registry; this measures what that walk costs per save. The
parameters are hoist's sample GPT-style model (`hoist plan --list-arrays`),
sharded over a 2 x 4 mesh of JAX CPU devices as `hoist demo` shards them;
the optimizer state is optax.adamw's (count, mu, nu). Each form is saved
once untimed, then `--rounds` times; the median time until save() returns
(the time training is blocked) is reported for each, and their ratio.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    import jax
    import optax
    from flax.training import train_state

    import hoist
    specs = benchlib.array_list(benchlib.parse_bytes(args.size))
    params, _ = benchlib.jax_arrays(specs, benchlib.host_arrays(specs))
    state = train_state.TrainState.create(apply_fn=None, params=params,
                                          tx=optax.adamw(1e-3))
    adam = state.opt_state[0]
    plain = {"step": 0, "params": dict(params),
             "opt_state": [{"count": adam.count, "mu": dict(adam.mu),
                            "nu": dict(adam.nu)}, {}, {}]}
    arrays = len(jax.tree_util.tree_leaves(state))
    root = tempfile.mkdtemp(dir=args.dir)
    total = sum(getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(state))
    try:
        with hoist.CheckpointManager(root, pool_bytes=total + (256 << 20),
                                     keep=1) as mgr:
            times, step = {}, 0
            # Alternating, so both forms see the same drift of the machine.
            for label, tree in (("TrainState", state), ("plain dicts", plain),
                                ("TrainState", state), ("plain dicts", plain)):
                step += 1
                mgr.save(step, tree).wait()  # warm-up
                for _ in range(args.rounds):
                    step += 1
                    start = time.perf_counter()
                    handle = mgr.save(step, tree)
                    times.setdefault(label, []).append(
                        time.perf_counter() - start)
                    handle.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ts = statistics.median(times["TrainState"])
    pd = statistics.median(times["plain dicts"])
    print(f"{total / 2**30:.2f} GiB in {arrays} arrays: blocked (median of "
          f"{len(times['TrainState'])}) TrainState {ts * 1e3:.1f} ms, plain "
          f"dicts {pd * 1e3:.1f} ms: {ts / pd:.3f}x")


if __name__ == "__main__":
    main()
