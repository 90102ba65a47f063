#!/usr/bin/env python3
"""Shared reads across hosts, against each rank reading for itself, on 4
simulated hosts x 2 ranks (testing/netns_hosts.py), the root on SeaweedFS
behind a link shaped to a host's share of a cluster's storage bandwidth.

    .venv/bin/python bench/hosts.py [--mib 128] [--host-mbit 2000]
        [--store-mbit 400] [--out FILE]

A torch.distributed job (gloo over the hosts' links) saves --mib MiB (8
float32 arrays sharded over the 8 ranks) and restores it whole on every
rank (each rank needs every byte): with shared reads (the job reads each
byte from the store once and passes it between hosts) and with each rank
reading for itself. Reports each restore's time (barrier to barrier) and
the bytes the job read from the store.

Then the local tier across hosts: steps 1-3 saved with a local tier per
rank (2 replicas; step 2 also durable), host h2 lost (its ranks' local
roots removed, the copies they held of others' parts with them), and step
3 restored from the local tier (h2's parts rebuilt from their copies on
other hosts, over the hosts' links), against step 2 restored from the
store through its shaped link. Needs root and network namespaces.
"""
import os
import shutil
import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testing"))

from hosts_job import logs, run_job  # noqa: E402
from netns_hosts import Hosts  # noqa: E402
from object_store_server import S3Server  # noqa: E402


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--host-mbit", type=int, default=2000)
    parser.add_argument("--store-mbit", type=int, default=400)
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args()
    why = Hosts.unavailable()
    if why:
        sys.exit(f"hosts.py: {why}")
    with tempfile.TemporaryDirectory(prefix="hoist_hosts_") as scratch, \
            Hosts(4, rate_mbit=args.host_mbit,
                  store_rate_mbit=args.store_mbit) as hosts, \
            S3Server(Path(scratch) / "s3", host=hosts.store_address,
                     netns=hosts.store) as server:
        def job(root, mode):
            out = Path(scratch) / mode
            records, codes = run_job(hosts, server, root, out, args.mib,
                                     mode, timeout=1200)
            if codes != [0] * len(codes):
                sys.exit(f"hosts.py: the {mode} job failed:\n{logs(out)}")
            return records

        records = job(f"s3://{server.bucket}/b", "share")
        local = Path(scratch) / "local"
        os.environ["HOIST_HOSTS_LOCAL"] = str(local)
        tiers_root = f"s3://{server.bucket}/t"
        job(tiers_root, "tiers")
        for rank in (4, 5):  # host h2's disks
            shutil.rmtree(local / str(rank))
        tier = job(tiers_root, "tier_restore")
        durable = job(tiers_root, "durable_restore")
    report = {"mib": args.mib, "host_mbit": args.host_mbit,
              "store_mbit": args.store_mbit, "ranks": len(records),
              "hosts": sorted({r["host"] for r in records.values()})}
    for mode in ("shared", "alone"):
        report[mode] = {
            "seconds": max(r[mode]["seconds"] for r in records.values()),
            "job_bytes_read": sum(r[mode]["bytes_read"]
                                  for r in records.values()),
            "exact": all(r[mode]["exact"] for r in records.values())}
    report["alone_over_shared"] = (report["alone"]["seconds"]
                                   / report["shared"]["seconds"])
    report["host_h2_lost"] = {
        "local_tier_s": max(r["seconds"] for r in tier.values()),
        "local_tier": sorted({r["tier"] for r in tier.values()}),
        "bytes_received": sum(r["bytes_received"] for r in tier.values()),
        "note": tier[0]["note"],
        "durable_s": max(r["seconds"] for r in durable.values()),
        "exact": all(r["exact"] for r in list(tier.values())
                     + list(durable.values()))}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
