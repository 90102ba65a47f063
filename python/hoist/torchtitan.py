"""hoist.torchtitan: torchtitan's checkpoint manager over hoist (the
adapter lives in hoist/integrations/torchtitan.py)."""
from .integrations.torchtitan import CheckpointManager  # noqa: F401

__all__ = ["CheckpointManager"]
