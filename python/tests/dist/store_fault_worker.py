"""One rank of a torchrun job whose object store fails one rank's uploads
(run by test_store_faults.py, each rank through its own listener of
testing/fault_proxy.py in front of SeaweedFS).

  store_fault_worker.py ROOT OUT SETUP_JSON

SETUP_JSON: {"endpoints": [rank 0's URL, ...], "control": the proxy's
control URL, "faults": [rules, one list per faulty save],
"coordinator_timeout_s", "request_timeout_s"}.

Step 1 saves through a healthy store. Then, for each list of rules: rank 0
installs them, every rank saves the next step and records how its wait()
failed and how long it took, rank 0 clears the rules, every rank restores
the last committed step and checks it bit-exact, and saves again through
the healthy store. Each rank writes OUT.RANK.json: one record per faulty
save.
"""
import json
import sys
import time
import urllib.request

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import hoist
import outcome  # beside this script

ROOT, OUT, SETUP = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])


def full(step):
    """The weight saved at `step`: 8 MiB, different at every step."""
    return torch.arange(2048 * 1024, dtype=torch.float32).reshape(2048, 1024) \
        + step


def set_rules(rules):
    request = urllib.request.Request(
        SETUP["control"] + "/rules", data=json.dumps(rules).encode(),
        method="PUT")
    urllib.request.urlopen(request, timeout=10).read()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    def state(step):
        return {"w": distribute_tensor(full(step), mesh, [Shard(0)])}

    mgr = hoist.CheckpointManager(
        ROOT, pool_bytes=16 << 20,
        coordinator_timeout_s=SETUP["coordinator_timeout_s"],
        storage_options={
            "endpoint": SETUP["endpoints"][rank],
            "request_timeout_s": str(SETUP["request_timeout_s"])})

    def restored_exactly(step):
        got = mgr.restore(step, like=state(0))["w"].full_tensor()
        return bool(torch.equal(got, full(step)))

    mgr.save(1, state(1)).wait()
    committed, records = 1, []
    for number, rules in enumerate(SETUP["faults"]):
        faulty = 2 + 2 * number
        dist.barrier()
        if rank == 0:
            set_rules(rules)
        dist.barrier()
        record, began = {"step": faulty, "type": None}, time.monotonic()
        try:
            mgr.save(faulty, state(faulty)).wait()
        except Exception as error:  # noqa: BLE001 (the test reads it)
            record.update(type=type(error).__name__, error=str(error))
        record["waited_s"] = time.monotonic() - began
        try:  # the error once more from the manager: taken
            mgr.wait_until_finished()
        except Exception:  # noqa: BLE001
            pass
        dist.barrier()
        if rank == 0:
            set_rules([])
        dist.barrier()
        record["steps_after"] = mgr.steps
        record["last_committed_exact"] = restored_exactly(committed)
        healthy = faulty + 1
        mgr.save(healthy, state(healthy)).wait()
        committed = healthy
        record["next_exact"] = restored_exactly(healthy)
        records.append(record)
    mgr.close()
    with open(f"{OUT}.{rank}.json", "w") as f:
        json.dump(records, f)
    outcome.exit_without_teardown()


if __name__ == "__main__":
    main()
