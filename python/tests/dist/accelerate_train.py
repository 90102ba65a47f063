"""An Accelerate training job (accelerate launch, CPU) that checkpoints
with hoist.accelerate at the end of each epoch; test_accelerate.py runs it.

  accelerate_train.py ROOT OUT EPOCHS [OPTIONS_JSON] [ROOT OUT EPOCHS
                      OPTIONS_JSON ...]

Several jobs run one after another in the same processes (a launch
fewer: most of a launch is its start-up), each from a fresh model and
Accelerator, each as the same job alone would.

OPTIONS: resume (true: load the newest step first), kill_epoch (every
process SIGKILLs itself right after the save of that epoch returned: while
it is in flight). The model has dropout and the loader shuffles with a
seedable sampler, so a bit-identical resume needs the RNG states and the
sampler's position back; a registered object counts the epochs done. The
main process writes the final parameters to OUT and the epoch training
started at to OUT.start.
"""
import os
import signal

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

import hoist.accelerate
from jobs import job_groups  # beside this script


class Progress:
    """A registered object: the epochs done."""

    def __init__(self):
        self.epochs = 0

    def state_dict(self):
        return {"epochs": self.epochs}

    def load_state_dict(self, state):
        self.epochs = state["epochs"]


def main():
    accelerator = None
    for root, out, epochs, options in job_groups(
            "accelerate_train.py ROOT OUT EPOCHS [OPTIONS_JSON] "
            "[ROOT OUT EPOCHS OPTIONS_JSON ...]"):
        accelerator = train(root, out, int(epochs), options)
    accelerator.end_training()


def train(root, out, epochs, options):
    """One job: trains `epochs` epochs (from the newest step of `root` with
    resume), saving each; returns its Accelerator."""
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(
            use_seedable_sampler=True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.Tanh(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(20, 7))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, 3, 0.5)
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(64, 12, generator=g),
                                          torch.randn(64, 7, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optim, loader, sched = accelerator.prepare(model, optim, loader,
                                                      sched)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if options.get("resume"):
        hoist.accelerate.load_state(accelerator, root, pool_bytes=16 << 20)
    start = progress.epochs
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optim.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optim.step()
            sched.step()
        progress.epochs = epoch + 1
        hoist.accelerate.save_state(accelerator, root, epoch,
                                    pool_bytes=16 << 20)
        if epoch == options.get("kill_epoch"):
            os.kill(os.getpid(), signal.SIGKILL)
    hoist.integrations.close_managers()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), out)
        with open(f"{out}.start", "w") as f:
            f.write(str(start))
    return accelerator


if __name__ == "__main__":
    main()
