"""A Hugging Face Trainer job (torchrun, CPU, DDP over gloo) that
checkpoints with hoist.transformers; test_transformers.py runs it.

  trainer_train.py ROOT OUT MAX_STEPS [OPTIONS_JSON] [ROOT OUT MAX_STEPS
                   OPTIONS_JSON ...]

Several jobs run one after another in the same processes (a launch fewer),
each from a fresh model and Trainer, each as the same job alone would.
ROOT is the Trainer's output_dir, or an s3:// root (output_dir is then
OUT.dir). The switch to hoist is the job's two lines marked "hoist".

OPTIONS: plain (the Trainer itself, no hoist), resume (true, or a
checkpoint path), kill_step (every process SIGKILLs itself once the save
of that step returned: while it is in flight), stop_step (training stops
there, after its save), sigterm_step (rank 1 gets SIGTERM there, with
enable_jit_checkpoint: hoist's preemption save; each step then takes 0.5
s more, so the ranks agree before max_steps even on a loaded machine),
save_total_limit. The tiny Llama has dropout and the sampler shuffles, so
a bit-identical resume needs every process's RNG states and the data
position back. The main process writes the final parameters to OUT, and
the global steps training started and ended at to OUT.start and OUT.end.
"""
import os
import signal
import time

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainerCallback, TrainingArguments)

from hoist.transformers import HoistTrainer  # hoist
from jobs import job_groups  # beside this script


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count=48, length=16):
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, 96, (count, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Steer(TrainerCallback):
    """The job's interruptions: kill_step, stop_step, sigterm_step."""

    def __init__(self, options):
        self.options = options
        self.slow = False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.options.get("stop_step"):
            control.should_save = True
            control.should_training_stop = True
        if state.global_step == self.options.get("sigterm_step"):
            self.slow = True
            if args.process_index == 1:
                os.kill(os.getpid(), signal.SIGTERM)
        if self.slow:
            time.sleep(0.5)
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.options.get("kill_step"):
            os.kill(os.getpid(), signal.SIGKILL)


class Ends(TrainerCallback):
    """Where training started and ended (global steps)."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        self.end = state.global_step


def main():
    for root, out, max_steps, options in job_groups(
            "trainer_train.py ROOT OUT MAX_STEPS [OPTIONS_JSON] "
            "[ROOT OUT MAX_STEPS OPTIONS_JSON ...]"):
        train(root, out, int(max_steps), options)


def train(root, out, max_steps, options):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=32,
                         attention_dropout=0.1, tie_word_embeddings=False,
                         attn_implementation="eager")
    model = LlamaForCausalLM(config)
    on_store = "://" in root
    args = TrainingArguments(
        output_dir=f"{out}.dir" if on_store else root, max_steps=max_steps,
        per_device_train_batch_size=4, learning_rate=3e-3,
        lr_scheduler_type="linear", warmup_steps=2, save_strategy="steps",
        save_steps=2, save_total_limit=options.get("save_total_limit"),
        logging_steps=1, report_to="none", disable_tqdm=True, use_cpu=True,
        seed=0, enable_jit_checkpoint="sigterm_step" in options)
    ends = Ends()
    callbacks = [Steer(options), ends]
    if options.get("plain"):
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                          callbacks=callbacks)
    else:
        trainer = HoistTrainer(  # hoist
            model=model, args=args, train_dataset=Tokens(),
            callbacks=callbacks,
            checkpoint_root=root if on_store else None,
            checkpoint_options={"pool_bytes": 8 << 20,
                                "preemption_poll_s": 0.1})
    trainer.train(resume_from_checkpoint=options.get("resume"))
    if args.process_index == 0:
        torch.save(model.state_dict(), out)
        for name, step in (("start", ends.start), ("end", ends.end)):
            with open(f"{out}.{name}", "w") as f:
                f.write(str(step))


if __name__ == "__main__":
    main()
