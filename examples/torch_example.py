"""Using hoist from PyTorch: a model, its optimizer, LR scheduler and
GradScaler checkpointed every step as objects (keeping the last 3), then
resumed into fresh objects in place, as torch.distributed.checkpoint does.

    .venv/bin/python examples/torch_example.py
"""
import sys
import tempfile

import torch

import hoist


def make():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    return model, opt, sched, scaler


model, opt, sched, scaler = make()
root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
with hoist.CheckpointManager(root, keep=3) as mgr:
    for step in range(1, 6):
        loss = model(torch.randn(8, 256)).pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        # The objects themselves: each is saved through its state_dict().
        # Returns once the tensors are copied; the next step may change them.
        mgr.save(step, {"model": model, "opt": opt, "sched": sched,
                        "scaler": scaler, "step": step})
    mgr.wait_until_finished()
    print("steps kept:", mgr.steps)

    # Resume fresh objects from the latest step: each is loaded in place
    # with load_state_dict (a fresh optimizer has no state yet: the saved
    # state dict decides).
    fresh = make()
    state = mgr.restore(like={"model": fresh[0], "opt": fresh[1],
                              "sched": fresh[2], "scaler": fresh[3],
                              "step": 0})

assert state["step"] == 5 and state["model"] is fresh[0]
assert torch.equal(fresh[0][0].weight, model[0].weight)
assert fresh[2].last_epoch == sched.last_epoch
assert fresh[1].param_groups[0]["lr"] == opt.param_groups[0]["lr"]
print("resumed at step", state["step"], "lr", fresh[1].param_groups[0]["lr"])
