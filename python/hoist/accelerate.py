"""hoist.accelerate: Accelerate's save_state and load_state over hoist (the
adapter lives in hoist/integrations/accelerate.py)."""
from .integrations.accelerate import FORMAT_KEY, load_state, save_state  # noqa

__all__ = ["save_state", "load_state", "FORMAT_KEY"]
