#!/usr/bin/env python3
"""Each framework's default checkpoint path against the same job through
hoist's adapter for it, in one run.

    .venv/bin/python bench/integrations.py [--size 1GiB] [--rounds 5]
                                           [--frameworks dcp,lightning,...]

The state is hoist's sample model (bench/benchlib.py's arrays: bf16 weights,
fp32 Adam moments; --size of them), in each framework's own form:
  dcp:        a state dict of tensors. Default: dcp.async_save with
              FileSystemWriter (its default stager: this host has no CUDA
              to pin memory with), dcp.load. hoist: the same calls with
              hoist.dcp.Writer / Reader.
  lightning:  a checkpoint dict shaped as Lightning's (state_dict,
              optimizer_states, epoch, global_step). Default:
              TorchCheckpointIO. hoist: HoistCheckpointIO (save returns
              staged; teardown waits for the commit).
  accelerate: the tensors as an nn.Module's parameters, prepared with an
              SGD optimizer. Default: accelerator.save_state / load_state.
              hoist: hoist.accelerate.save_state / load_state.
  trainer:    the tensors as an nn.Module's parameters in a Hugging Face
              Trainer with an SGD optimizer. Default: the Trainer's own
              _save_checkpoint (safetensors, optimizer.pt, RNG, state
              JSON) and its resume's loads. hoist: HoistTrainer (save
              returns staged; wait_for_checkpoints() for the commit).
  deepspeed:  the tensors as an nn.Module's parameters in a DeepSpeed
              engine (one process, gloo, no optimizer: its model states
              file). Default: TorchCheckpointEngine's save_checkpoint /
              load_checkpoint. hoist: hoist.deepspeed.use(engine) (save
              returns staged; the engine's wait() for the commit).
  orbax:      JAX arrays sharded over a 2 x 4 mesh of CPU devices.
              Default: ocp.CheckpointManager (async) with StandardSave /
              StandardRestore. hoist: hoist.orbax.CheckpointManager.
For each, --rounds timed saves (after an untimed warm-up save), each into
a new step: blocked (until the save call returns and the state may
change) and save (until durable: committed for hoist, which fsyncs; the
default's completion followed by os.sync(), timed); then --rounds loads
of the last step, each after the page cache is emptied. hoist saves
whole steps (deltas off: the state does not change between the saves,
and a delta would write nothing; the defaults write everything). Figures are
medians, samples kept; ratios are default / hoist (above 1: hoist is
faster). Each system runs in its own process. Writes DIR/integrations.json
and prints a table; exits 1 if hoist is not ahead on all three for some
framework (the goal), 2 if a system failed.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402  (the arrays, cache dropping, child processes)

# Off the path again: bench/multiprocess.py would hide PyPI's multiprocess,
# which the Trainer's imports (datasets) need.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

FRAMEWORKS = ["dcp", "lightning", "accelerate", "trainer", "deepspeed",
              "orbax"]
GIB = 1 << 30


def _tensors(specs):
    return benchlib.torch_tensors(benchlib.host_arrays(specs))


def _module(specs, scalars_as_vectors=False):
    """(names, an nn.Module holding the state's tensors as its parameters
    `weights`, in the names' order (0-d ones as one element if asked),
    their shapes)."""
    import torch
    tensors = _tensors(specs)
    names = sorted(tensors)
    model = torch.nn.Module()
    model.weights = torch.nn.ParameterList(
        torch.nn.Parameter(
            tensors[n].reshape(-1) if scalars_as_vectors and
            tensors[n].dim() == 0 else tensors[n], requires_grad=False)
        for n in names)
    return names, model, [tensors[n].shape for n in names]


def _sync_wait(fn):
    """fn() then os.sync(): what the default's save costs to durable."""
    fn()
    os.sync()


# -- each framework: state, then save / load for "default" and "hoist" -----


class Dcp:
    def __init__(self, specs, path, system, args):
        import torch.distributed.checkpoint as dcp
        import hoist.dcp
        self.dcp, self.hoist_dcp = dcp, hoist.dcp
        self.state = _tensors(specs)
        self.path, self.system, self.args = path, system, args
        benchlib.dcp_group()

    def save(self, step):
        """(blocked s, save s)."""
        if self.system == "hoist":
            writer = self.hoist_dcp.Writer(self.path, step, deltas=False,
                                           pool_bytes=self.args.pool)
        else:
            writer = self.dcp.FileSystemWriter(f"{self.path}/{step}")
        start = time.perf_counter()
        future = self.dcp.async_save(self.state, storage_writer=writer)
        blocked = time.perf_counter() - start
        future.result()
        if self.system != "hoist":
            os.sync()
        return blocked, time.perf_counter() - start

    def load(self, step):
        import torch
        target = {k: torch.empty_like(v) for k, v in self.state.items()}
        reader = (self.hoist_dcp.Reader(self.path, step)
                  if self.system == "hoist" else
                  self.dcp.FileSystemReader(f"{self.path}/{step}"))
        start = time.perf_counter()
        self.dcp.load(target, storage_reader=reader)
        return time.perf_counter() - start, target


class Lightning:
    def __init__(self, specs, path, system, args):
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
        from hoist.lightning import HoistCheckpointIO
        self.io = (HoistCheckpointIO(pool_bytes=args.pool, deltas=False)
                   if system == "hoist" else TorchCheckpointIO())
        tensors = _tensors(specs)
        self.names = sorted(tensors)
        self.half = len(self.names) // 2  # weights; the rest as moments
        self.state = {
            "epoch": 1, "global_step": 100,
            "pytorch-lightning_version": "2.6.6",
            "state_dict": {n: tensors[n] for n in self.names[:self.half]},
            "optimizer_states": [{
                "state": {i: {"exp_avg": tensors[n]} for i, n in
                          enumerate(self.names[self.half:])},
                "param_groups": [{"lr": 1e-3}]}]}
        self.path, self.system = path, system
        os.makedirs(path, exist_ok=True)

    def save(self, step):
        file = f"{self.path}/epoch={step}.ckpt"
        start = time.perf_counter()
        self.io.save_checkpoint(self.state, file)
        blocked = time.perf_counter() - start
        if self.system == "hoist":
            self.io.teardown()  # the commit and the pointer
        else:
            os.sync()
        return blocked, time.perf_counter() - start

    def load(self, step):
        start = time.perf_counter()
        out = self.io.load_checkpoint(f"{self.path}/epoch={step}.ckpt")
        seconds = time.perf_counter() - start
        every = dict(out["state_dict"])
        moments = out["optimizer_states"][0]["state"]
        for i, name in enumerate(self.names[self.half:]):
            every[name] = moments[i]["exp_avg"]
        return seconds, every


class Accelerate:
    def __init__(self, specs, path, system, args):
        import torch
        from accelerate import Accelerator
        import hoist.accelerate
        self.hoist_accelerate = hoist.accelerate
        self.names, model, _ = _module(specs)
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
        self.accelerator = Accelerator(cpu=True)
        self.model, _ = self.accelerator.prepare(model, optim)
        self.path, self.system, self.args = path, system, args

    def save(self, step):
        start = time.perf_counter()
        if self.system == "hoist":
            handle = self.hoist_accelerate.save_state(
                self.accelerator, self.path, step, deltas=False,
                pool_bytes=self.args.pool)
            blocked = time.perf_counter() - start
            handle.wait()
        else:
            self.accelerator.save_state(f"{self.path}/{step}")
            blocked = time.perf_counter() - start
            os.sync()
        return blocked, time.perf_counter() - start

    def load(self, step):
        start = time.perf_counter()
        if self.system == "hoist":
            self.hoist_accelerate.load_state(self.accelerator, self.path,
                                             step)
        else:
            self.accelerator.load_state(f"{self.path}/{step}")
        seconds = time.perf_counter() - start
        weights = self.accelerator.unwrap_model(self.model).weights
        return seconds, {n: weights[i].data for i, n in enumerate(self.names)}


class HfTrainer:
    """The Trainer's checkpoint and its resume's loads (model, optimizer
    and scheduler, RNG), as Trainer.train(resume_from_checkpoint=...) runs
    them, without training."""

    def __init__(self, specs, path, system, args):
        import torch
        from transformers import Trainer, TrainingArguments
        from hoist.transformers import HoistTrainer
        self.names, model, _ = _module(specs)
        training = TrainingArguments(output_dir=path, report_to="none",
                                     use_cpu=True, save_strategy="no")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if system == "hoist":
            self.trainer = HoistTrainer(
                model=model, args=training, optimizers=(optimizer, None),
                checkpoint_options={"pool_bytes": args.pool,
                                    "deltas": False})
        else:
            self.trainer = Trainer(model=model, args=training,
                                   optimizers=(optimizer, None))
        self.trainer.create_optimizer_and_scheduler(num_training_steps=10)
        self.path, self.system = path, system

    def save(self, step):
        self.trainer.state.global_step = step
        start = time.perf_counter()
        self.trainer._save_checkpoint(self.trainer.model, trial=None)
        blocked = time.perf_counter() - start
        if self.system == "hoist":
            self.trainer.wait_for_checkpoints()
        else:
            os.sync()
        return blocked, time.perf_counter() - start

    def load(self, step):
        import tempfile
        trainer = self.trainer
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as here:
            if self.system == "hoist":
                trainer._hoist_resumed = trainer._hoist_restore(step, here)
                where = here
            else:
                where = f"{self.path}/checkpoint-{step}"
            trainer._load_from_checkpoint(where)
            trainer._load_optimizer_and_scheduler(where)
            trainer._load_rng_state(where)
        if self.system == "hoist":
            trainer._hoist_resumed = None
        seconds = time.perf_counter() - start
        weights = trainer.model.weights
        return seconds, {n: weights[i].data for i, n in enumerate(self.names)}


class DeepSpeed:
    def __init__(self, specs, path, system, args):
        os.environ.update(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0",
                          WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(benchlib.free_port()))
        import deepspeed
        import hoist.deepspeed
        # DeepSpeed's broadcast at initialize takes no 0-d parameter: a
        # scalar is held as one element.
        self.names, model, self.shapes = _module(specs,
                                                 scalars_as_vectors=True)
        self.engine, _, _, _ = deepspeed.initialize(model=model, config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 0}})
        self.hoist = None
        if system == "hoist":
            self.hoist = hoist.deepspeed.use(self.engine, path,
                                             pool_bytes=args.pool,
                                             deltas=False)
        self.path = path

    def save(self, step):
        start = time.perf_counter()
        self.engine.save_checkpoint(self.path, tag=f"global_step{step}")
        blocked = time.perf_counter() - start
        if self.hoist is not None:
            self.hoist.wait()
        else:
            os.sync()
        return blocked, time.perf_counter() - start

    def load(self, step):
        start = time.perf_counter()
        self.engine.load_checkpoint(self.path, tag=f"global_step{step}",
                                    load_optimizer_states=False,
                                    load_lr_scheduler_states=False)
        seconds = time.perf_counter() - start
        weights = self.engine.module.weights
        return seconds, {n: weights[i].data.reshape(self.shapes[i])
                         for i, n in enumerate(self.names)}


class Orbax:
    def __init__(self, specs, path, system, args):
        import orbax.checkpoint as ocp
        from hoist.orbax import CheckpointManager
        self.ocp = ocp
        host = benchlib.host_arrays(specs)
        self.state, shardings = benchlib.jax_arrays(specs, host)
        self.abstract = benchlib.abstract_jax(specs, shardings)
        options = ocp.CheckpointManagerOptions(save_interval_steps=1)
        if system == "hoist":
            self.manager = CheckpointManager(
                path, options=options,
                hoist={"pool_bytes": args.pool, "deltas": False})
        else:
            self.manager = ocp.CheckpointManager(path, options=options)
        self.system = system

    def save(self, step):
        start = time.perf_counter()
        self.manager.save(step, args=self.ocp.args.StandardSave(self.state),
                          force=True)
        blocked = time.perf_counter() - start
        self.manager.wait_until_finished()
        if self.system != "hoist":
            os.sync()
        return blocked, time.perf_counter() - start

    def load(self, step):
        start = time.perf_counter()
        out = self.manager.restore(
            step, args=self.ocp.args.StandardRestore(self.abstract))
        for array in out.values():
            array.block_until_ready()
        return time.perf_counter() - start, out


JOBS = {"dcp": Dcp, "lightning": Lightning, "accelerate": Accelerate,
        "trainer": HfTrainer, "deepspeed": DeepSpeed, "orbax": Orbax}


def child(args):
    """One framework, one system: the timed saves and loads."""
    specs = benchlib.array_list(args.size)
    path = os.path.join(args.dir, f"{args.framework}-{args.system}")
    shutil.rmtree(path, ignore_errors=True)
    job = JOBS[args.framework](specs, path, args.system, args)
    job.save(0)  # warm-up: imports, threads, the pool, a writer process
    saves = [job.save(step) for step in range(1, args.rounds + 1)]
    loads, verified = [], True
    host = benchlib.host_arrays(specs)
    for _ in range(args.rounds):
        cache = benchlib.drop_caches(path)
        seconds, out = job.load(args.rounds)
        loads.append(seconds)
        verified = verified and benchlib.same(out, host)
    result = {"blocked_s_samples": [b for b, _ in saves],
              "save_s_samples": [s for _, s in saves],
              "load_s_samples": loads, "cache": cache, "verified": verified}
    for key in ("blocked_s", "save_s", "load_s"):
        result[key] = statistics.median(result[key + "_samples"])
    print("RESULT " + json.dumps(result), flush=True)
    if args.system == "hoist":
        import hoist.integrations
        hoist.integrations.close_managers()
    shutil.rmtree(path, ignore_errors=True)


def run(framework, system, args):
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    env.setdefault("JAX_PLATFORMS", "cpu")
    return benchlib.child_result(
        [sys.executable, os.path.abspath(__file__), "--child", "--framework",
         framework, "--system", system, "--size", str(args.size), "--rounds",
         str(args.rounds), "--pool", str(args.pool), "--dir", args.dir], env)


def table(report):
    lines = [f"{report['bytes'] / GIB:.2f} GiB state, medians of "
             f"{report['rounds']}; ratio = default / hoist (> 1: hoist "
             "faster)", "",
             f"{'framework':<11} {'system':<8} {'blocked s':>10} "
             f"{'save s':>8} {'load s':>8}  ok"]
    for framework, systems in report["frameworks"].items():
        for system, r in systems.items():
            if "error" in r:
                lines.append(f"{framework:<11} {system:<8} {r['error']}")
                continue
            lines.append(f"{framework:<11} {system:<8} {r['blocked_s']:>10.3f}"
                         f" {r['save_s']:>8.3f} {r['load_s']:>8.3f}  "
                         f"{'yes' if r['verified'] else 'NO'}")
        ratios = report["ratios"].get(framework)
        if ratios:
            lines.append(f"{framework:<11} {'ratio':<8} "
                         f"{ratios['blocked']:>9.2f}x {ratios['save']:>7.2f}x "
                         f"{ratios['load']:>7.2f}x")
    lines.append("")
    for framework, verdict in report["goal"].items():
        lines.append(f"goal: hoist ahead of {framework}'s default on blocked,"
                     f" save and load: {verdict}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=benchlib.parse_bytes, default=GIB,
                        help="the state's bytes (default 1GiB)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed saves and loads per system (default 5)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help="comma-separated subset of " +
                        ",".join(FRAMEWORKS))
    parser.add_argument("--pool", type=benchlib.parse_bytes, default=None,
                        help="hoist's pinned pool (default: the state's "
                        "size plus an eighth, so one wave stages it)")
    parser.add_argument("--dir", default="bench-scratch",
                        help="where the checkpoints go (default "
                        "bench-scratch/)")
    parser.add_argument("--out", default="bench-results",
                        help="where integrations.json goes")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON")
    parser.add_argument("--child", action="store_true",
                        help=argparse.SUPPRESS)
    parser.add_argument("--framework", help=argparse.SUPPRESS)
    parser.add_argument("--system", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pool is None:
        args.pool = args.size + args.size // 8
    # Absolute: Orbax refuses a relative checkpoint path.
    args.dir = os.path.abspath(args.dir)
    if args.child:
        return child(args)
    frameworks = [f for f in args.frameworks.split(",") if f]
    unknown = sorted(set(frameworks) - set(FRAMEWORKS))
    if unknown:
        parser.error(f"unknown frameworks {unknown} (have {FRAMEWORKS})")
    os.makedirs(args.dir, exist_ok=True)
    report = {"bytes": args.size, "rounds": args.rounds, "pool": args.pool,
              "frameworks": {}, "ratios": {}, "goal": {}}
    failed = False
    for framework in frameworks:
        results = {s: run(framework, s, args) for s in ("default", "hoist")}
        report["frameworks"][framework] = results
        if any("error" in r for r in results.values()):
            failed = True
            report["goal"][framework] = "not measured (a system failed)"
            continue
        d, h = results["default"], results["hoist"]
        ratios = {k: d[f"{k}_s"] / h[f"{k}_s"]
                  for k in ("blocked", "save", "load")}
        report["ratios"][framework] = ratios
        behind = [k for k, v in ratios.items() if v <= 1]
        report["goal"][framework] = ("met" if not behind else
                                     "NOT met: behind on " + ", ".join(behind))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "integrations.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1) if args.json else table(report))
    if failed:
        return 2
    return 0 if all(v == "met" for v in report["goal"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
