"""A job of python/tests/dist/hosts_worker.py over testing/netns_hosts.py's
simulated hosts, as the test and bench/hosts.py run it: `per_host` ranks
on each host, torch.distributed (gloo) over the hosts' links, the object
store's credentials in every rank's environment."""
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from object_store_server import free_ports

WORKER = (Path(__file__).resolve().parent.parent / "python" / "tests"
          / "dist" / "hosts_worker.py")


def run_job(hosts, server, root, out, mib, mode, per_host=2, timeout=240,
            cut=None):
    """hosts_worker.py `mode` on every host, rank r on host r // per_host;
    with `cut`, that host's link goes down once rank 0 says step 2's save
    has begun. Returns each rank's record (by rank) and exit codes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = hosts.count * per_host
    port = free_ports(1)[0]
    # Rank 0 writes a byte into this FIFO once step 2's save has begun;
    # the reader is open before any rank starts, so its write never waits.
    saving = None
    if cut is not None:
        fifo = out / "saving"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        saving = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    procs = []
    for rank in range(ranks):
        env = dict(os.environ, **server.env, RANK=str(rank),
                   WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank % per_host),
                   MASTER_ADDR=hosts.addresses[0], MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
        with open(out / f"rank_{rank}.log", "wb") as log:
            procs.append(hosts.popen(
                rank // per_host,
                [sys.executable, str(WORKER), root, str(out), str(mib), mode],
                env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        if saving is not None:
            ready, _, _ = select.select([saving], [], [],
                                        max(0, deadline - time.monotonic()))
            if not ready or not os.read(saving, 1):
                raise TimeoutError("step 2's save never began")
            hosts.cut(cut)
        codes = [proc.wait(timeout=max(1, deadline - time.monotonic()))
                 for proc in procs]
    finally:
        if saving is not None:
            os.close(saving)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    records = {}
    for rank in range(ranks):
        path = out / f"rank_{rank}.json"
        if path.exists():
            records[rank] = json.loads(path.read_text())
    return records, codes


def logs(out):
    """The tail of every rank's output, for a failure's message."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted(Path(out).glob("rank_*.log")))
