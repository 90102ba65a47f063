"""hoist.deepspeed: DeepSpeed's checkpoints as hoist steps (the adapter
lives in hoist/integrations/deepspeed.py)."""
from .integrations.deepspeed import (  # noqa
    FORMAT_KEY, HoistCheckpointEngine, fp32_state_dict, tag_step, use)

__all__ = ["use", "HoistCheckpointEngine", "FORMAT_KEY", "tag_step",
           "fp32_state_dict"]
