"""A Lightning job (single device, or DDP under torchrun on the CPU) whose
checkpoints go through hoist.lightning.HoistCheckpointIO;
test_lightning.py runs it.

  lightning_train.py CKPT_DIR OUT MAX_EPOCHS [OPTIONS_JSON]
                     [CKPT_DIR OUT MAX_EPOCHS OPTIONS_JSON ...]

Several jobs run one after the other in the same processes (a launch and
Lightning's import cost more than a job here); a job that kills itself
ends them.

OPTIONS: resume (a checkpoint's path), kill_epoch (rank 0 SIGKILLs itself
right after the save of that epoch's checkpoint returned: while it is in
flight), io ("hoist", default, or "torch": Lightning's own). Rank 0 writes
the final parameters to OUT, and the epoch training started at to
OUT.start.
"""
import os
import signal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from hoist.lightning import HoistCheckpointIO
from jobs import job_groups  # beside this script


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 20),
                                       torch.nn.Tanh(), torch.nn.Linear(20, 7))
        self.save_hyperparameters({"width": 20, "note": "hoist"})

    def on_train_start(self):
        self.start_epoch = self.current_epoch  # > 0 once resumed

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        optim = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return [optim], [torch.optim.lr_scheduler.StepLR(optim, 2, 0.5)]


def data():
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(64, 12, generator=g), torch.randn(64, 7, generator=g)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=8)


class KillingIO(HoistCheckpointIO):
    """Kills this process once the save of epoch `kill_epoch` returned
    (staged, still being written)."""

    def __init__(self, kill_epoch, **options):
        super().__init__(**options)
        self.kill_epoch = kill_epoch

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        super().save_checkpoint(checkpoint, path, storage_options)
        if checkpoint["epoch"] == self.kill_epoch:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    for ckpt_dir, out, epochs, options in job_groups(
            "lightning_train.py CKPT_DIR OUT MAX_EPOCHS [OPTIONS_JSON] "
            "[CKPT_DIR OUT MAX_EPOCHS OPTIONS_JSON ...]"):
        fit(ckpt_dir, out, int(epochs), options)


def fit(ckpt_dir, out, epochs, options):
    """One job: `epochs` epochs checkpointed into `ckpt_dir`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    plugins = []
    if options.get("io", "hoist") == "hoist":
        kill = options.get("kill_epoch")
        plugins = [KillingIO(kill, pool_bytes=16 << 20) if kill is not None
                   else HoistCheckpointIO(pool_bytes=16 << 20)]
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=world,
        strategy="ddp" if world > 1 else "auto", plugins=plugins,
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, monitor="loss",
                                   save_top_k=2, save_last=True)],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=True)
    model = Model()
    trainer.fit(model, data(), ckpt_path=options.get("resume"))
    if trainer.global_rank == 0:
        torch.save(model.net.state_dict(), out)
        with open(f"{out}.start", "w") as f:
            f.write(str(model.start_epoch))


if __name__ == "__main__":
    main()
