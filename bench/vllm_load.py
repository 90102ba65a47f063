#!/usr/bin/env python3
"""vLLM loading a Llama-shaped bf16 model: its own safetensors loader
against the load format "hoist", on the same disk, page cache dropped.

    .venv-vllm/bin/python bench/vllm_load.py [--size 1GiB] [--runs 3]
                                             [--dir DIR] [--json]

Makes a Llama-shaped model of at least --size (bfloat16, random weights,
hidden 2048, its layers as many as the size needs) and writes it twice in
--dir (default: a temp directory under the repository, removed): as one
safetensors file with its config.json (what vLLM loads by itself), and as
step 1 of a hoist root saved as a training job saves it ({"model": state
dict}, the config kept with the step). Then, --runs times each, in turn:
the page cache dropped, an engine started in a fresh process (vLLM's CPU
build: run it with .venv-vllm, LD_PRELOAD=.venv-vllm/lib/libiomp5.so and
VLLM_CPU_KVCACHE_SPACE=1, which this script sets for its engines), and
recorded: the weight-loading time as vLLM's own log line gives it
("Loading weights took"; hoist's loader logs the same line), and the time
to a ready engine (process start to generate() returning a token).
Then, --runs times each, the readers outside vLLM (bench/weight_readers.py:
safetensors, fastsafetensors, the Run:ai Model Streamer and hoist, each in
a fresh process, page cache dropped): the file's tensors read into
untouched parameter-like tensors, as a loader does. vLLM 0.32 runs
fastsafetensors only on CUDA devices (its iterator places tensors on
cuda:N), and its Run:ai loader logs no weight-loading time, so those two
are compared here, outside the engine.
Reported: medians; the disk's read limit (build/release's save_bench
--repeats 1: fio-style, several io_uring jobs and depths, O_DIRECT) and
each loader's bytes per second against it. Goals: hoist's weight load
faster than vLLM's safetensors loader, hoist's read faster than every
other reader, and hoist's load within 0.9 of the read limit.

Not here: tensorizer, S3, and tensor parallelism.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 2048, 16, 4, 5632, 32000
READERS = ("safetensors", "fastsafetensors", "runai", "hoist")


def config(layers):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": layers, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS,
            "vocab_size": VOCAB, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
            "tie_word_embeddings": False}


def shapes(layers):
    kv = KV_HEADS * HIDDEN // HEADS
    out = {"model.embed_tokens.weight": (VOCAB, HIDDEN),
           "model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({
            p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": (kv, HIDDEN),
            p + "self_attn.v_proj.weight": (kv, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,)})
    return out


def layers_for(size):
    base = 2 * VOCAB * HIDDEN + HIDDEN
    per = sum(n for k, s in shapes(1).items() if ".layers." in k
              for n in [s[0] * (s[1] if len(s) > 1 else 1)])
    return max(1, -(-(size // 2 - base) // per))


def make(directory, size):
    """The model written both ways: (safetensors dir, hoist root, bytes)."""
    import torch
    from safetensors.torch import save_file

    import hoist
    import hoist.vllm
    layers = layers_for(size)
    generator = torch.Generator().manual_seed(0)
    state = {name: (torch.randn(shape, generator=generator) * 0.02).to(
        torch.bfloat16) for name, shape in shapes(layers).items()}
    files, root = (os.path.join(directory, d) for d in ("safetensors", "root"))
    os.makedirs(files)
    save_file(state, os.path.join(files, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(files, "config.json"), "w") as f:
        json.dump(config(layers), f)
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, {"model": state},
                 metadata=hoist.vllm.config_metadata(config(layers))).wait()
    return files, root, sum(t.numel() * 2 for t in state.values())


def engine(model_dir, load_format=None, extra=None):
    """(weights s, ready s, log) of one engine start in a fresh process."""
    venv = os.path.dirname(os.path.dirname(sys.executable))
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1",
               LD_PRELOAD=os.path.join(venv, "lib", "libiomp5.so"))
    options = ({} if load_format is None else
               {"load_format": load_format,
                "model_loader_extra_config": extra})
    code = (
        "import json, sys\n"
        "from vllm import LLM, SamplingParams\n"
        f"llm = LLM(model={model_dir!r}, skip_tokenizer_init=True, "
        "dtype='bfloat16', max_model_len=128, enforce_eager=True, "
        f"**json.loads({json.dumps(options)!r}))\n"
        "llm.generate([{'prompt_token_ids': [1, 2, 3]}], "
        "SamplingParams(max_tokens=1, temperature=0))\n"
        "print('hoist-bench-ready', flush=True)\n"
        "llm.llm_engine.engine_core.shutdown()\n")
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code], env=env,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines, ready = [], None
    for line in process.stdout:
        lines.append(line)
        if "hoist-bench-ready" in line and ready is None:
            ready = time.perf_counter() - start
    process.wait()
    log = "".join(lines)
    found = re.search(r"Loading weights took ([0-9.]+) seconds", log)
    if process.returncode != 0 or ready is None or found is None:
        raise SystemExit(f"the engine ({load_format or 'safetensors'}) "
                         f"failed:\n{log[-4000:]}")
    return float(found.group(1)), ready


def reader(name, files, root):
    """Seconds bench/weight_readers.py takes with reader `name`."""
    venv = os.path.dirname(os.path.dirname(sys.executable))
    env = dict(os.environ,
               LD_PRELOAD=os.path.join(venv, "lib", "libiomp5.so"))
    out = subprocess.run(
        [sys.executable, os.path.join(benchlib.ROOT, "bench",
                                      "weight_readers.py"), name,
         os.path.join(files, "model.safetensors"), root],
        env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the reader {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def read_limit(directory, nbytes):
    """The disk's read limit in GB/s (save_bench's raw read), or None
    without build/release."""
    if not os.path.exists(benchlib.SAVE_BENCH):
        return None
    out = benchlib.cpp_json([benchlib.SAVE_BENCH, "--bytes", str(nbytes),
                             "--dir", directory, "--repeats", "1",
                             "--no-export", "--json"])
    return out["raw_read_gbps"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", help="where the model goes (default: a "
                        "temp directory under the repository, removed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(
            dir=args.dir or benchlib.ROOT, prefix="hoist-vllm-") as directory:
        files, root, nbytes = make(directory, benchlib.parse_bytes(args.size))
        runs = {"safetensors": [], "hoist": []}
        for _ in range(args.runs):
            for name in runs:
                cache = benchlib.drop_caches(directory)
                weights, ready = (
                    engine(files) if name == "safetensors" else
                    engine(files, "hoist", {"root": root}))
                runs[name].append({"weights_s": weights, "ready_s": ready,
                                   "page_cache": cache})
        reads = {name: [] for name in READERS}
        for _ in range(args.runs):
            for name in reads:
                benchlib.drop_caches(directory)
                reads[name].append(reader(name, files, root))
        limit = read_limit(directory, nbytes)
    medians = {name: {key: statistics.median(r[key] for r in rs)
                      for key in ("weights_s", "ready_s")}
               for name, rs in runs.items()}
    for m in medians.values():
        m["gbps"] = nbytes / m["weights_s"] / 1e9
        m["vs_read_limit"] = m["gbps"] / limit if limit else None
    read_medians = {name: statistics.median(r) for name, r in reads.items()}
    goals = {"hoist's weight load faster than vLLM's safetensors loader":
             medians["hoist"]["weights_s"] <
             medians["safetensors"]["weights_s"],
             "hoist's read faster than every other reader":
             all(read_medians["hoist"] < s for n, s in read_medians.items()
                 if n != "hoist")}
    if limit:
        goals["hoist within 0.9 of the disk's read limit"] = (
            medians["hoist"]["vs_read_limit"] >= 0.9)
    out = {"bytes": nbytes, "runs": runs, "medians": medians,
           "reads": reads, "read_medians": read_medians,
           "read_limit_gbps": limit, "goals": goals}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"hoist bench/vllm_load: a Llama-shaped bf16 model of "
              f"{nbytes / 2**30:.2f} GiB, {args.runs} runs, page cache "
              f"{runs['hoist'][0]['page_cache']}; disk read limit "
              f"{limit if limit is None else f'{limit:.2f} GB/s'}")
        for name, m in medians.items():
            ratio = ("" if m["vs_read_limit"] is None else
                     f", {m['vs_read_limit']:.2f}x the read limit")
            print(f"  {name:12s} weights {m['weights_s']:.3f} s "
                  f"({m['gbps']:.2f} GB/s{ratio}), engine ready "
                  f"{m['ready_s']:.1f} s")
        print("  outside vLLM, the file into untouched parameters:")
        for name, seconds in read_medians.items():
            print(f"  {name:16s} {seconds:.3f} s "
                  f"({nbytes / seconds / 1e9:.2f} GB/s)")
        for goal, met in goals.items():
            print(f"  {'PASS' if met else 'FAIL'}  {goal}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
