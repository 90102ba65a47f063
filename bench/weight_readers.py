#!/usr/bin/env python3
"""One weight reader, timed in a process of its own (bench/vllm_load.py
runs it once per reader and run, page cache dropped before each):

    python bench/weight_readers.py READER SAFETENSORS_FILE HOIST_ROOT

Times what a model loader does with a checkpoint: every tensor's bytes
from the file into memory the loader owns, as a model's parameters
(tensors made with torch.empty before the clock starts, not touched, as
vLLM's are when its loader begins). Readers:
  safetensors      safe_open, then get_tensor and copy_ each
  fastsafetensors  SafeTensorsFileLoader(nogds=True) on the CPU: the file's
                   bytes into its buffer, then copy_ each tensor out
  runai            the Run:ai Model Streamer's SafetensorsStreamer, copy_
                   each tensor as it streams in
  hoist            step 1 of HOIST_ROOT read straight into the parameters
                   (hoist._read.read_regions, every extent's XXH3 checked)
Prints {"reader", "seconds", "bytes"} as JSON.
"""
import json
import sys
import time

import torch
from safetensors import safe_open


def parameters(path):
    """{name: untouched tensor} shaped and typed as the file's tensors."""
    with safe_open(path, "pt") as f:
        return {k: torch.empty(f.get_slice(k).get_shape(),
                               dtype=_dtype(f.get_slice(k).get_dtype()))
                for k in f.keys()}


def _dtype(name):
    return {"BF16": torch.bfloat16, "F16": torch.float16,
            "F32": torch.float32}[name]


def safetensors_reader(path, params, _root):
    with safe_open(path, "pt") as f:
        for k, p in params.items():
            p.copy_(f.get_tensor(k))


def fastsafetensors_reader(path, params, _root):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    try:
        loader.add_filenames({0: [path]})
        buffer = loader.copy_files_to_device()
        try:
            for k, p in params.items():
                p.copy_(buffer.get_tensor(k))
        finally:
            buffer.close()
    finally:
        loader.close()


def runai_reader(path, params, _root):
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(path)
        for k, tensor in streamer.get_tensors():
            params[k].copy_(tensor)


def hoist_reader(_path, params, root):
    from hoist._read import read_regions
    targets = [(f"model/{k}", str(p.dtype).removeprefix("torch."),
                list(p.shape), [(-1, [0] * p.dim(), list(p.shape),
                                 p.view(torch.uint8).numpy())])
               for k, p in params.items()]
    read_regions(root, 1, targets)


READERS = {"safetensors": safetensors_reader,
           "fastsafetensors": fastsafetensors_reader,
           "runai": runai_reader, "hoist": hoist_reader}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in READERS:
        sys.exit(__doc__)
    reader, path, root = sys.argv[1:]
    params = parameters(path)
    start = time.perf_counter()
    READERS[reader](path, params, root)
    seconds = time.perf_counter() - start
    print(json.dumps({"reader": reader, "seconds": seconds,
                      "bytes": sum(p.numel() * p.element_size()
                                   for p in params.values())}))


if __name__ == "__main__":
    main()
