"""hoist.lightning: Lightning's CheckpointIO over hoist (the adapter lives
in hoist/integrations/lightning.py)."""
from .integrations.lightning import POINTER_FORMAT, HoistCheckpointIO  # noqa

__all__ = ["HoistCheckpointIO", "POINTER_FORMAT"]
