"""hoist.dcp: PyTorch DCP's StorageWriter and StorageReader over hoist
(the adapter lives in hoist/integrations/dcp.py)."""
from .integrations.dcp import FORMAT_KEY, Reader, Writer  # noqa: F401

__all__ = ["Writer", "Reader", "FORMAT_KEY"]
