"""Several hosts on one machine, for the tests and benchmarks that need a
job to span hosts: each host is a Linux network namespace with a veth link
to a bridge of the test's own, its processes each in a UTS namespace of
their own with the host's name, and every link shaped with tc tbf (both
ways) to a rate the caller picks. A `store` namespace holds a server (the
job's shared object store) behind a link of its own rate.

    with Hosts(4, rate_mbit=1000, store_rate_mbit=200) as hosts:
        server = S3Server(dir, host=hosts.store_address, netns=hosts.store)
        proc = hosts.popen(2, [python, "worker.py"], env)   # on host h2
        hosts.cut(2)        # host h2's link goes down, as a failed NIC
        hosts.mend(2)

Every name is the harness's own (an 8-character prefix drawn at random:
namespaces, the bridge, the veths), every address is in a /24 of
10.0.0.0/8 drawn at random, and everything is removed on exit, whatever
happened (and what a killed run left behind can be removed by
`python testing/netns_hosts.py --clean`). It needs root and network
namespaces: Hosts.unavailable() says why not, for a test to skip with.
"""
import os
import random
import shutil
import subprocess
import sys

_PREFIX = "hxns"  # every name this harness makes starts with it


def _run(*argv, check=True):
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


class Hosts:
    """`count` hosts named h0..h{count-1}, and a store; see the module's
    text. rate_mbit / store_rate_mbit: each host's / the store's link, each
    way (None: unshaped)."""

    def __init__(self, count, rate_mbit=None, store_rate_mbit=None):
        self.count = count
        self.rate_mbit, self.store_rate_mbit = rate_mbit, store_rate_mbit
        tag = "".join(random.choice("0123456789abcdef") for _ in range(4))
        self._id = f"{_PREFIX}{tag}"
        net = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
        self._bridge_address = f"{net}.1"
        self.addresses = [f"{net}.{10 + h}" for h in range(count)]
        self.store_address = f"{net}.2"
        self.namespaces = [f"{self._id}h{h}" for h in range(count)]
        self.store = f"{self._id}st"
        self.names = [f"h{h}" for h in range(count)]
        self._bridge = f"{self._id}br"
        self._made = []  # (kind, name), undone in reverse

    @staticmethod
    def unavailable():
        """None when hosts can be made here, else why not (for a skip)."""
        if os.geteuid() != 0:
            return "needs root (network namespaces, veths, tc)"
        for tool in ("ip", "tc", "unshare"):
            if shutil.which(tool) is None:
                return f"needs {tool} (iproute2, util-linux)"
        probe = f"{_PREFIX}probe{os.getpid()}"
        done = _run("ip", "netns", "add", probe, check=False)
        if done.returncode != 0:
            return f"network namespaces are not allowed: {done.stderr.strip()}"
        _run("ip", "netns", "del", probe, check=False)
        return None

    def __enter__(self):
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _make(self):
        _run("ip", "link", "add", self._bridge, "type", "bridge")
        self._made.append(("link", self._bridge))
        _run("ip", "addr", "add", f"{self._bridge_address}/24", "dev",
             self._bridge)
        _run("ip", "link", "set", self._bridge, "up")
        for h, (ns, address) in enumerate(zip(self.namespaces,
                                               self.addresses)):
            self._make_host(ns, f"{self._id}v{h}", address, self.rate_mbit)
        self._make_host(self.store, f"{self._id}vs", self.store_address,
                        self.store_rate_mbit)

    def _make_host(self, ns, outer, address, rate_mbit):
        _run("ip", "netns", "add", ns)
        self._made.append(("netns", ns))
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name",
             outer + "i")
        self._made.append(("link", outer))
        _run("ip", "link", "set", outer + "i", "netns", ns)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", outer + "i",
             "name", "eth0")
        _run("ip", "link", "set", outer, "master", self._bridge)
        _run("ip", "link", "set", outer, "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24",
             "dev", "eth0")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if rate_mbit:
            # Both ways: the host's sends leave through its eth0, what it
            # receives leaves the bridge through the outer end.
            shape = ["tbf", "rate", f"{rate_mbit}mbit", "burst", "256kb",
                     "latency", "100ms"]
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev",
                 "eth0", "root", *shape)
            _run("tc", "qdisc", "add", "dev", outer, "root", *shape)

    def close(self):
        """Removes every namespace and link made, newest first; a process
        still running in a namespace keeps it alive only until it exits."""
        while self._made:
            kind, name = self._made.pop()
            if kind == "netns":
                _run("ip", "netns", "del", name, check=False)
            else:
                _run("ip", "link", "del", name, check=False)

    def command(self, host, argv):
        """`argv` as run on host `host` (its namespace, and its name in a
        UTS namespace of its own)."""
        return ["ip", "netns", "exec", self.namespaces[host], "unshare",
                "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.names[host], *argv]

    def popen(self, host, argv, env=None, **kwargs):
        return subprocess.Popen(self.command(host, argv), env=env, **kwargs)

    def cut(self, host):
        """Host `host`'s link goes down (a failed NIC or switch port)."""
        _run("ip", "link", "set", f"{self._id}v{host}", "down")

    def mend(self, host):
        _run("ip", "link", "set", f"{self._id}v{host}", "up")


def clean():
    """Removes what a killed run of this harness left (its prefix's)."""
    for line in _run("ip", "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(_PREFIX) and not name.endswith("i"):
            _run("ip", "link", "del", name, check=False)
    for line in _run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0]
        if name.startswith(_PREFIX):
            _run("ip", "netns", "del", name, check=False)


if __name__ == "__main__":
    if sys.argv[1:] == ["--clean"]:
        clean()
    else:
        sys.exit(__doc__)
