"""hoist.transformers: the Hugging Face Trainer's checkpoints as hoist
steps (the adapter lives in hoist/integrations/transformers.py)."""
from .integrations.transformers import (  # noqa
    FORMAT_KEY, HoistCheckpointMixin, HoistTrainer, checkpoint_step,
    export_model)

__all__ = ["HoistTrainer", "HoistCheckpointMixin", "FORMAT_KEY",
           "checkpoint_step", "export_model"]
