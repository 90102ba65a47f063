"""What the Python tests share: JAX sees 8 CPU devices (set before
anything imports jax); the real object-store servers on 127.0.0.1 (one of
each per test session: testing/object_store_server.py); the framework
adapters' managers closed after each test; `base`, a place for a test's
roots on a directory and on S3; the long marker (HOIST_LONG=1)."""
import os
import sys
import uuid
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The benchmarks the tests run evict only their own files from the page
# cache, not the machine's (bench/benchlib.py's drop_caches).
os.environ.setdefault("HOIST_BENCH_EVICT_ONLY", "1")

import pytest  # noqa: E402


@pytest.fixture
def root(tmp_path):
    return tmp_path / "ckpt"


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testing"))
import object_store_server  # noqa: E402


def _require(server_class, tmp_path_factory):
    try:
        server = server_class(tmp_path_factory.mktemp(server_class.name))
        server.start()
    except Exception as e:  # noqa: BLE001
        if os.environ.get("HOIST_REQUIRE_OBJECT_STORE"):
            pytest.fail(f"no {server_class.name}: {e}")
        pytest.skip(f"no {server_class.name}: {e}")
    return server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    server = _require(object_store_server.S3Server, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    server = _require(object_store_server.GcsServer, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The S3 server, its environment set for the test (and the processes
    it starts)."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


def pytest_collection_modifyitems(config, items):
    """Tests marked slow run first (the longest first, as a scheduler packs
    best: pytest-xdist's workers then take the short ones as they finish,
    and no long test starts last, when the other worker is idle). Tests
    marked long run only with HOIST_LONG=1 (the suite stays within its
    budget: docs/development.md)."""
    def seconds(item):  # slow(S): about S seconds here
        marker = item.get_closest_marker("slow")
        return marker.args[0] if marker is not None and marker.args else 0

    items.sort(key=lambda item: -seconds(item))  # stable: the rest in order
    if os.environ.get("HOIST_LONG"):
        return
    skip = pytest.mark.skip(reason="long: run with HOIST_LONG=1")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.long)])
def base(request, tmp_path):
    """Where a test puts its roots: a directory, then a fresh prefix on
    the S3 server (its environment set). The S3 one is long (HOIST_LONG=1)
    unless a test names its params (indirect=["base"])."""
    if request.param == "s3":
        server = request.getfixturevalue("s3_env")
        return f"s3://{server.bucket}/{uuid.uuid4().hex[:12]}"
    return str(tmp_path)


@pytest.fixture(autouse=True)
def _adapters_closed():
    """The managers a framework adapter opened during a test, closed."""
    yield
    managers = sys.modules.get("hoist.integrations._managers")
    if managers is not None:
        managers.close_managers()
