"""One rank of a tiny Llama's FSDP2 training job (torchrun, gloo, CPU) that
checkpoints with hoist; test_vllm.py runs it, then serves what it saved.

  llama_train.py ROOT DCP_ROOT MODEL_DIR

Trains a Llama built from a config (fp32 weights, as a job's master
weights are) for 2 steps of AdamW on random tokens, then saves step 2 twice:
with hoist.CheckpointManager ({"model": its state dict, "optim": AdamW's},
DTensors both, the model's config kept in the step's metadata) into ROOT,
and with dcp.save through hoist.dcp.Writer (dcp_train.py's Stateful app
state, as torchtitan's jobs hand DCP theirs) into DCP_ROOT. Rank 0 writes the config
as MODEL_DIR/config.json.
"""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

import hoist
import hoist.dcp
import hoist.vllm
from dcp_train import AppState  # beside this script: DCP's app state

STEPS = 2


def build():
    # head_dim 64: vLLM's CPU attention refuses 16.
    config = LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, max_position_embeddings=256,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def main(root, dcp_root, model_dir):
    dist.init_process_group("gloo")
    model, optim = build()
    tokens = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(STEPS):
        batch = torch.randint(0, 512, (2, 16), generator=tokens)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
    app = AppState(model, optim)
    with hoist.CheckpointManager(root, pool_bytes=16 << 20) as mgr:
        mgr.save(STEPS, app.state_dict(),
                 metadata=hoist.vllm.config_metadata(model)).wait()
    dcp.save({"app": app}, storage_writer=hoist.dcp.Writer(
        dcp_root, STEPS, pool_bytes=16 << 20))
    if dist.get_rank() == 0:
        hoist.vllm.config_dir(root, model_dir)
    hoist.integrations.close_managers()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
