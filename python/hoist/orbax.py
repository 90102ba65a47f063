"""hoist.orbax: Orbax's CheckpointManager API over hoist (the adapter
lives in hoist/integrations/orbax.py)."""
from .integrations.orbax import CheckpointManager  # noqa: F401

__all__ = ["CheckpointManager"]
