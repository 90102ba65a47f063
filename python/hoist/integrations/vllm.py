"""vLLM loads a hoist step directly: the load format "hoist".

    LLM(model=MODEL_DIR, load_format="hoist",
        model_loader_extra_config={"root": "s3://b/run1", "step": 1200})
    vllm serve MODEL_DIR --load-format hoist \\
        --model-loader-extra-config '{"root": "/ckpt"}'

MODEL_DIR holds the model's Hugging Face config (config.json, and the
tokenizer if any); the weights come from step `step` of hoist root `root`
(default: its newest committed step), read without a lock beside a trainer
that is saving into it, every extent's XXH3 checked as it is read, before
the engine serves. The loader is registered through the entry point
"vllm.general_plugins" (hoist's wheel declares it), so vLLM's spawned
workers know it too; `import hoist` imports no vLLM.

Names. A step's arrays are named by the paths of what was saved
({"model": model.state_dict(), "optim": ...} gives "model/model.layers.0.
self_attn.q_proj.weight"); DCP's keys are dotted ("model.model.layers.0...").
The loader hands the model its checkpoint names: the array names that
follow `prefix` (as `hoist export --prefix`: "FROM", or "FROM=TO" to put TO
in its place). Without one, the prefix is found from the array that ends in
the model's embedding ("model.embed_tokens.weight", ...). Arrays outside
the prefix, and those whose rest has a "/" (optimizer state saved beside
the model), are not the model's and are skipped. `names` ({array name:
checkpoint name}) maps any other layout, array by array.

Options (model_loader_extra_config):
  root              the hoist root: a directory, s3://BUCKET/PREFIX or
                    gs://BUCKET/PREFIX (required)
  step              the step (default: the newest committed one)
  prefix            as above (default: found)
  names             {array name: checkpoint name}: only these arrays
  skip_unused       true: arrays the model does not take are skipped (by
                    default they fail the load, each named)
  dtype_conversion  "refuse" (default): an array whose floating dtype is
                    not the model's fails the load, named; "allow": it is
                    converted (fp32 master weights into a bf16 model)
  storage_options   as hoist.CheckpointManager's (S3/GCS endpoint, ...)
  read_bytes        at most this many bytes of arrays held at once: a
                    batch the model takes while the next half is read
                    (default 1 GiB)
  boxes             "auto" (default): each worker reads only the box of
                    each array its weight loaders keep (with tensor
                    parallelism), and an array its loaders only copy into
                    a CPU parameter is read straight into it, bypassing
                    load_weights (found by running the model's
                    load_weights on probes: _vllm_boxes.py); "whole": every
                    array whole, through load_weights; "probe": as "auto"
                    (kept for older configs)

A root alone is enough to serve when the training job keeps the model's
config with its steps: save(step, state, metadata=hoist.vllm.
config_metadata(model)); then config_dir(root) (or `python -m
hoist.vllm config ROOT DIR`) writes config.json for vLLM's MODEL_DIR.

A load that fails (a corrupt byte, a missing or unknown array, another
model's step, a dtype change) raises before the engine serves, naming the
root, the step and the array.
"""

import math

_OPTIONS = ("root", "step", "prefix", "names", "skip_unused",
            "dtype_conversion", "storage_options", "read_bytes", "boxes")
_BOXES = ("auto", "whole", "probe")

# What a causal LM's embedding is named in its Hugging Face checkpoint: the
# array that ends in one of these tells where the model's names begin.
_EMBEDDINGS = ("model.embed_tokens.weight", "transformer.wte.weight",
               "gpt_neox.embed_in.weight", "model.decoder.embed_tokens.weight",
               "transformer.word_embeddings.weight")

_registered = []

#: The key of a step's metadata (save(..., metadata=)) that holds the
#: model's Hugging Face config (config_metadata, config_dir).
CONFIG_KEY = "hf_config"


def register():
    """vLLM's general plugin (entry point "vllm.general_plugins"): registers
    the load format "hoist" in this process, once."""
    if _registered:
        return
    from vllm.model_executor.model_loader import register_model_loader
    register_model_loader("hoist")(_loader_class())
    _registered.append(True)


class LoadError(ValueError):
    """A hoist step that vLLM cannot load as it is asked to."""


def config_metadata(model, metadata=None):
    """`metadata` (a dict, default empty) with the Hugging Face config of
    `model` (a transformers model, FSDP-wrapped or not, or its config, or
    the config's dict) under CONFIG_KEY: what a training job gives
    save(..., metadata=) to keep the model's config with each step. The
    model's class goes in as "architectures" where the config has none (a
    model built from a config): vLLM picks its implementation by it."""
    config = getattr(model, "config", model)
    config = dict(config if isinstance(config, dict) else config.to_dict())
    if not config.get("architectures") and hasattr(model, "config"):
        config["architectures"] = [next(
            (c.__name__ for c in type(model).__mro__
             if c.__module__.startswith("transformers.models.")),
            type(model).__name__)]
    out = dict(metadata or {})
    out[CONFIG_KEY] = config
    return out


def config_dir(root, out_dir, step=None, *, storage_options=None):
    """Writes the config a step keeps (config_metadata) as out_dir/
    config.json, vLLM's MODEL_DIR; returns out_dir. LoadError when the
    step keeps none."""
    import json
    import os

    import hoist
    from .._read import step_path
    manifest = hoist.inspect(step_path(str(root), step),
                             storage_options=storage_options)
    user = manifest["metadata"].get("user") or {}
    config = user.get(CONFIG_KEY) if isinstance(user, dict) else None
    if not isinstance(config, dict):
        raise LoadError(
            f"step {manifest['step']} of {root} keeps no model config (save "
            "with metadata=hoist.vllm.config_metadata(model))")
    if not config.get("architectures"):
        raise LoadError(
            f"the config step {manifest['step']} of {root} keeps names no "
            "architectures, by which vLLM picks the model (give "
            "config_metadata the model, not its config)")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def main(argv=None):
    """python -m hoist.vllm config ROOT DIR [--step N]."""
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m hoist.vllm",
        description="vLLM and hoist roots (docs/inference.md)")
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser(
        "config", help="write the model config a step keeps as DIR/"
        "config.json: vLLM's MODEL_DIR for --load-format hoist")
    config.add_argument("root", help="the hoist root (a directory, "
                        "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX)")
    config.add_argument("dir", help="where config.json goes")
    config.add_argument("--step", type=int,
                        help="the step (default: the newest committed)")
    args = parser.parse_args(argv)
    try:
        print(config_dir(args.root, args.dir, args.step))
    except (LoadError, OSError, ValueError) as error:
        parser.exit(1, f"hoist.vllm: {error}\n")
    return 0


def _check_options(extra):
    if not isinstance(extra, dict):
        raise LoadError("load format 'hoist': model_loader_extra_config must "
                        f"be a dict, got {type(extra).__name__}")
    unknown = sorted(set(extra) - set(_OPTIONS))
    if unknown:
        raise LoadError(f"load format 'hoist': unknown options {unknown} "
                        f"(known: {', '.join(_OPTIONS)})")
    if not extra.get("root"):
        raise LoadError("load format 'hoist': model_loader_extra_config "
                        "needs 'root' (the hoist root to load from)")
    conversion = extra.get("dtype_conversion", "refuse")
    if conversion not in ("refuse", "allow"):
        raise LoadError(f"load format 'hoist': dtype_conversion="
                        f"{conversion!r}: use 'refuse' or 'allow'")
    if extra.get("boxes", "auto") not in _BOXES:
        raise LoadError(f"load format 'hoist': boxes={extra['boxes']!r}: "
                        f"use one of {', '.join(_BOXES)}")
    names = extra.get("names")
    if names is not None and not isinstance(names, dict):
        raise LoadError("load format 'hoist': names must be a dict {array "
                        "name: checkpoint name}")
    return extra


def _found_prefix(saved):
    """The prefix of the model's names among `saved` (array names), from
    its embedding's array."""
    for name in saved:
        for embedding in _EMBEDDINGS:
            if name.endswith(embedding):
                return name[:-len(embedding)]
    return None


def plan(arrays, options):
    """[(array name, checkpoint name)] of the model's arrays among `arrays`
    (the manifest's entries), by `options`' prefix or names (see the
    module's docstring)."""
    saved = [a["name"] for a in arrays]
    names = options.get("names")
    if names is not None:
        missing = sorted(set(names) - set(saved))
        if missing:
            raise LoadError(f"names: {len(missing)} arrays are not in the "
                            f"step: {missing[:10]}")
        return list(names.items())
    prefix = options.get("prefix")
    if prefix is None:
        prefix = _found_prefix(saved)
        if prefix is None:
            raise LoadError(
                "cannot tell which arrays are the model's: none ends in a "
                f"known embedding name ({', '.join(_EMBEDDINGS)}); give "
                "'prefix' or 'names'")
    source, _, target = prefix.partition("=")
    out = []
    for name in saved:
        if not name.startswith(source):
            continue
        rest = name[len(source):]
        if "/" in rest:  # not a checkpoint name: state saved beside it
            continue
        out.append((name, target + rest))
    if not out:
        raise LoadError(f"no array of the step starts with {source!r}")
    return out


def check_dtypes(wanted, arrays, dtype, options, where):
    """LoadError naming the first of `wanted` ([(array name, checkpoint
    name)]) whose floating dtype (`arrays`: name -> manifest entry) is not
    the model's `dtype`, unless options allow a conversion."""
    from .._tree import _numpy_dtype
    if options.get("dtype_conversion", "refuse") == "allow":
        return
    model_dtype = str(dtype).removeprefix("torch.")
    for name, _ in wanted:
        saved = arrays[name]["dtype"]
        if saved != model_dtype and _numpy_dtype(saved).kind in "fV":
            raise LoadError(
                f"{where}: array '{name}' is {saved} but the model is "
                f"{model_dtype}; dtype_conversion='allow' converts it")


def _batches(wanted, sizes, limit):
    """`wanted` in runs of at most `limit` bytes (one array alone may be
    larger)."""
    batch, total = [], 0
    for item in wanted:
        size = sizes[item[0]]
        if batch and total + size > limit:
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += size
    if batch:
        yield batch


def _loader_class():
    """The BaseModelLoader subclass (defined once vLLM is imported)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    import hoist
    from .._read import read_regions, step_path
    from .._tree import _aligned_bytes, _numpy_dtype
    from . import _vllm_boxes

    class HoistModelLoader(BaseModelLoader):
        """vLLM's model loader for load_format="hoist" (see the module)."""

        def __init__(self, load_config):
            super().__init__(load_config)
            self.options = _check_options(
                load_config.model_loader_extra_config)

        def download_model(self, model_config):
            """Nothing to download: checks that the step can be read."""
            self._manifest()

        def _manifest(self):
            root = str(self.options["root"]).rstrip("/")
            step = self.options.get("step")
            where = step_path(root, step)
            try:
                return hoist.inspect(
                    where, storage_options=self.options.get("storage_options"))
            except (OSError, ValueError) as error:
                raise LoadError(f"load format 'hoist': {where}: {error}") \
                    from None

        def load_weights(self, model, model_config):
            start = time.perf_counter()
            manifest = self._manifest()
            root, step = str(self.options["root"]), manifest["step"]
            where = f"step {step} of {root}"
            arrays = {a["name"]: a for a in manifest["arrays"]}
            try:
                wanted = plan(manifest["arrays"], self.options)
            except LoadError as error:
                raise LoadError(f"{where}: {error}") from None
            check_dtypes(wanted, arrays, model_config.dtype, self.options,
                         where)
            sizes = {name: math.prod(arrays[name]["shape"]) *
                     _numpy_dtype(arrays[name]["dtype"]).itemsize
                     for name, _ in wanted}
            uses = self._uses(model, wanted, arrays)
            read = [0]  # bytes read from storage
            placed = self._place(wanted, uses, arrays, manifest, read, where)
            loaded, unused = self._load_rest(
                model, [w for w in wanted if w[0] not in placed], sizes,
                uses, arrays, manifest, read, where)
            if loaded is not None and placed:
                loaded = set(loaded) | _vllm_boxes.parameters_placed(
                    model, uses)
            self._check_complete(model, loaded, where)
            taken = [n for n, _ in wanted if n not in unused]
            # As vLLM's own loader says it (bench/vllm_load.py reads it).
            logger.info(
                "Loading weights took %.2f seconds (hoist: %s, %d arrays, "
                "%.3f GiB, %.3f GiB read for tensor-parallel rank %d of %d, "
                "%d arrays read straight into their parameters, every "
                "extent verified)",
                time.perf_counter() - start, where, len(taken),
                sum(sizes[n] for n in taken) / 2**30, read[0] / 2**30,
                _tp()[0], _tp()[1], len(placed))

        def _load_rest(self, model, wanted, sizes, uses, arrays, manifest,
                       read, where):
            """Hands `wanted` to model.load_weights, read in batches:
            (what it says it loaded, the arrays skipped as unused)."""
            limit = int(self.options.get("read_bytes", 1 << 30))
            skip = bool(self.options.get("skip_unused", False))
            last = []  # the name of the array load_weights took last

            def weights(batch_list):
                # The next batch is read (without the GIL) while the model
                # takes this one: two batches of half read_bytes each.
                with ThreadPoolExecutor(1) as reader:
                    def start(batch):
                        return None if batch is None else (batch, reader.submit(
                            self._read, batch, arrays, uses, manifest, read,
                            where))

                    batches = iter(batch_list)
                    ahead = start(next(batches, None))
                    while ahead is not None:
                        batch, future = ahead
                        got = future.result()
                        ahead = start(next(batches, None))
                        for name, checkpoint_name in batch:
                            last[:] = [name]
                            yield checkpoint_name, got[name]
                        del got

            unused = []
            while True:
                last.clear()
                try:
                    return model.load_weights(weights(
                        _batches([w for w in wanted if w[0] not in unused],
                                 sizes, max(limit // 2, 1)))), unused
                except (KeyError, ValueError, AssertionError,
                        RuntimeError) as error:
                    if isinstance(error, LoadError) or not last:
                        raise
                    name = last[0]
                    if skip and isinstance(error, (KeyError, ValueError)):
                        unused.append(name)  # again without it
                        continue
                    raise LoadError(
                        f"{where}: array '{name}' (as "
                        f"'{dict(wanted)[name]}') does not load into "
                        f"{type(model).__name__}: {error}"
                        + ("" if skip else " (skip_unused=true skips arrays "
                           "the model does not take)")) from None

        def _uses(self, model, wanted, arrays):
            """{array: _vllm_boxes.Use}: the box of each array this
            worker's loaders keep, and where those that are only copied
            go; None (all whole, through load_weights) where the boxes
            option is "whole"."""
            if self.options.get("boxes", "auto") == "whole":
                return None
            return _vllm_boxes.probe(
                model, wanted, arrays,
                lambda name: _torch_dtype(_numpy_dtype(name)))

        def _place(self, wanted, uses, arrays, manifest, read, where):
            """Reads each array of `wanted` that has a place (Use.place:
            parameter memory its loaders only copy it into) straight
            there, in one call: the names of the arrays placed."""
            if uses is None:
                return set()
            targets, placed = [], set()
            for name, _ in wanted:
                target = uses[name].place
                if target is None:
                    continue
                origin, extent = uses[name].region()
                spec = arrays[name]
                targets.append((name, spec["dtype"], list(spec["shape"]), [
                    (-1, list(origin), list(extent),
                     target.detach().view(torch.uint8).numpy())]))
                placed.add(name)
            if targets:
                read[0] += self._read_targets(targets, manifest, where)
            return placed

        def _read_targets(self, targets, manifest, where):
            """Reads engine `targets` (read_regions'): the bytes read."""
            try:
                stats = read_regions(
                    str(self.options["root"]), manifest["step"], targets,
                    storage_options=self.options.get("storage_options"))
            except hoist.DataLossError as error:
                raise LoadError(f"{where}: {error}") from None
            return stats["bytes_read"]

        def _read(self, batch, arrays, uses, manifest, read, where):
            """{array: tensor} of `batch` ((array, checkpoint name)
            pairs), read in one call: each array's box where `uses` has
            one (in a tensor of its full shape: the box's bytes only),
            else whole. Adds the bytes read from storage to read[0]."""
            targets, made = [], {}
            for name, _ in batch:
                spec = arrays[name]
                dtype = _numpy_dtype(spec["dtype"])
                shape = list(spec["shape"])
                origin, extent = ((0,) * len(shape), shape) if uses is None \
                    else uses[name].region()
                raw = _aligned_bytes(math.prod(extent) * dtype.itemsize)
                targets.append((name, spec["dtype"], shape,
                                [(-1, list(origin), list(extent), raw)]))
                made[name] = (raw, dtype, shape, origin, extent)
            read[0] += self._read_targets(targets, manifest, where)
            return {name: _vllm_boxes.placed(raw, _torch_dtype(dtype), shape,
                                             origin, extent)
                    for name, (raw, dtype, shape, origin, extent)
                    in made.items()}

        @staticmethod
        def _check_complete(model, loaded, where):
            """Every parameter of the model came from the step (as vLLM's
            default loader checks, for unquantized models)."""
            if loaded is None:
                return
            missing = sorted({n for n, _ in model.named_parameters()} -
                             set(loaded))
            if missing:
                raise LoadError(
                    f"{where}: {len(missing)} of the model's parameters are "
                    f"not in the step: {missing[:10]}")

    def _torch_dtype(dtype):
        return getattr(torch, dtype.name)

    def _tp():
        """(this worker's tensor-parallel rank, the TP size)."""
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)
        try:
            return (get_tensor_model_parallel_rank(),
                    get_tensor_model_parallel_world_size())
        except (AssertionError, RuntimeError):  # no parallel state
            return 0, 1

    # Under "vllm", whose handler prints its loggers' lines.
    logger = init_logger("vllm.model_executor.model_loader.hoist")
    return HoistModelLoader
