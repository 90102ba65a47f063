"""hoist inside the training frameworks people already run: one thin
adapter per framework over hoist.CheckpointManager, each imported only when
used (``import hoist`` imports none of these frameworks), each writing an
ordinary hoist step (so ``hoist ls``, ``inspect``, ``verify`` and
``export`` work on it, on every root: a directory, s3://, gs://).

  hoist.dcp          PyTorch DCP: Writer (StorageWriter + AsyncStager),
                     Reader (StorageReader)
  hoist.lightning    Lightning: HoistCheckpointIO
  hoist.accelerate   Hugging Face Accelerate: save_state, load_state
  hoist.orbax        Orbax: CheckpointManager (ocp.CheckpointManager's API)
  hoist.torchtitan   torchtitan: CheckpointManager
  hoist.vllm         vLLM: the load format "hoist" (a plugin: inference, not
                     training; docs/inference.md)

See docs/integrations.md for each one's before/after lines.
"""

from ._managers import close_managers  # noqa: E402,F401 (no framework)
