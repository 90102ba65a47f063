"""hoist: asynchronous checkpointing of sharded arrays.

Training stalls only while its arrays are copied off the devices; writing,
hashing, committing and pruning happen in the background, and a committed
checkpoint is never lost or corrupted. Saves take a pytree (nested dicts,
lists and tuples) of JAX arrays (sharded or not), PyTorch tensors, NumPy
arrays or other DLPack producers; restores rebuild it, onto any sharding.

    mgr = hoist.CheckpointManager("/ckpt", keep=3)
    handle = mgr.save(step, state)      # returns once the arrays are copied
    ...                                 # training goes on
    mgr.wait_until_finished()
    state = mgr.restore(like=state)     # the latest step, shaped like `state`
"""

import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 with numpy)

from ._dist import JaxCoordinator, TorchCoordinator
from ._errors import CoordinationError, DataLossError
from ._interop import export, import_checkpoint
from ._manager import CheckpointManager, SaveHandle
from ._per_rank import PerRank
from ._read import diff, inspect, read, verify
from ._version import __version__

__all__ = ["CheckpointManager", "SaveHandle", "DataLossError",
           "CoordinationError", "inspect", "verify", "diff", "read", "export",
           "import_checkpoint", "TorchCoordinator", "JaxCoordinator",
           "PerRank", "__version__"]
