"""Using hoist from PyTorch: a model and its optimizer checkpointed every
step (keeping the last 3), then resumed into fresh objects.

    .venv/bin/python examples/torch_example.py
"""
import sys
import tempfile

import torch

import hoist

model = torch.nn.Linear(256, 256).to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
with hoist.CheckpointManager(root, keep=3) as mgr:
    for step in range(1, 6):
        loss = model(torch.randn(8, 256, dtype=torch.bfloat16)).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # Returns once the tensors are copied; the next step may change them.
        mgr.save(step, {"model": model.state_dict(), "opt": opt.state_dict(),
                        "step": step})
    mgr.wait_until_finished()
    print("steps kept:", mgr.steps)

    # Resume a fresh model and optimizer from the latest step: the saved
    # tree comes back as it was (tensors, ints, floats, nested dicts).
    fresh = torch.nn.Linear(256, 256).to(torch.bfloat16)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    state = mgr.restore()
    fresh.load_state_dict(state["model"])
    fresh_opt.load_state_dict(state["opt"])

assert state["step"] == 5
assert torch.equal(fresh.weight, model.weight)
print("resumed at step", state["step"])
