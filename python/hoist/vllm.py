"""hoist.vllm: vLLM's load format "hoist" (the plugin lives in
hoist/integrations/vllm.py; vLLM finds it through the entry point
"vllm.general_plugins", so this module need not be imported), and the
model config a training job keeps with its steps.

    python -m hoist.vllm config ROOT DIR [--step N]
"""
import sys

from .integrations.vllm import (  # noqa: F401
    CONFIG_KEY,
    LoadError,
    config_dir,
    config_metadata,
    main,
    plan,
    register,
)

__all__ = ["register", "plan", "config_metadata", "config_dir", "LoadError",
           "CONFIG_KEY"]

if __name__ == "__main__":
    sys.exit(main())
