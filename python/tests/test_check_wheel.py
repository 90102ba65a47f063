"""tools/check_wheel.py, the release check of what a wheel's binaries need
from outside it (tools/wheel.sh), on wheels made here from small shared
objects: one that needs only the C runtime passes; one that links a library
the wheel lacks fails, as does one that names a library it may dlopen, and
a wheel without the CLI."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parents[2] / "tools" / "check_wheel.py"

pytest.importorskip("elftools")
if shutil.which("cc") is None:
    pytest.skip("no C compiler", allow_module_level=True)


def elf(tmp_path, name, source, *libs):
    """A shared object built from C `source`."""
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", out,
                    tmp_path / f"{name}.c", *libs], check=True)
    return out.read_bytes()


def wheel(tmp_path, binary, cli=True):
    path = tmp_path / "hoist_checkpoint-0-cp312-cp312-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hoist/__init__.py", "")
        z.writestr("hoist/_version.py", "__version__ = '0'\n")
        z.writestr("hoist/_hoist.cpython-312-x86_64-linux-gnu.so", binary)
        z.writestr("hoist/libhoist_object_store.so", binary)
        if cli:
            z.writestr("hoist/_hoist_cli", binary)
    return path


def check(path):
    return subprocess.run([sys.executable, CHECK, path], capture_output=True,
                          text=True)


def test_a_wheel_needing_only_the_c_runtime_passes(tmp_path):
    plain = elf(tmp_path, "plain", "int f(void) { return 1; }\n")
    done = check(wheel(tmp_path, plain))
    assert done.returncode == 0, done.stdout
    assert "glibc >= 2." in done.stdout


def test_a_library_from_outside_the_wheel_fails_it(tmp_path):
    # xxHash: a build dependency of hoist's, so its headers are here.
    linked = elf(tmp_path, "linked", "#include <xxhash.h>\n"
                 "unsigned f(void) { return XXH_versionNumber(); }\n",
                 "-lxxhash")
    done = check(wheel(tmp_path, linked))
    assert done.returncode == 1
    assert "needs libxxhash.so.0, which is neither in the wheel" in done.stdout


def test_a_library_it_may_dlopen_fails_it(tmp_path):
    opener = elf(tmp_path, "opener",
                 'const char* f(void) { return "libfoo.so.3"; }\n')
    done = check(wheel(tmp_path, opener))
    assert done.returncode == 1
    assert "names libfoo.so.3 (loaded with dlopen?)" in done.stdout


def test_a_wheel_without_the_cli_fails(tmp_path):
    plain = elf(tmp_path, "plain", "int f(void) { return 1; }\n")
    done = check(wheel(tmp_path, plain, cli=False))
    assert done.returncode == 1
    assert "hoist/_hoist_cli is missing" in done.stdout
