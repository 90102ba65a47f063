"""Checks built wheels (tools/wheel.sh): every ELF file in each must need,
from outside the wheel, only the C and C++ runtimes, and pyarrow's Arrow
for the object-store module alone; the libraries it needs from inside must
be there; the package must carry the extension, the CLI and the module.
Libraries a binary may load with dlopen are found as the library names its
bytes hold: each must be one of the above, or the NVIDIA driver's
libcuda.so.1 (which the static CUDA runtime loads when backend="cuda" is
used, and which no wheel can carry: it must match the machine's driver).
Prints each wheel's tag, its size, and the newest glibc symbol version its
binaries use (the floor of the systems it installs on).

Usage: check_wheel.py WHEEL...   (exit 1 on the first wheel that fails)
"""
import io
import re
import sys
import zipfile

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

# The runtime every Linux has, and that manylinux lets a wheel use.
SYSTEM = re.compile(r"^(libc|libm|libpthread|libdl|librt|libstdc\+\+|"
                    r"libgcc_s|ld-linux-x86-64|ld-linux-aarch64)\.so(\.\d+)*$")
# pyarrow's, and only for the object-store module (hoist-checkpoint[s3]).
ARROW = re.compile(r"^libarrow(_s3)?\.so\.\d+$")
# The GPU driver, loaded by the CUDA runtime only for backend="cuda".
DRIVER = {"libcuda.so.1"}
LIBRARY_NAME = re.compile(rb"lib[A-Za-z0-9_+-]+\.so(?:\.[0-9]+)*")
MODULE = "hoist/libhoist_object_store.so"
REQUIRED = ["hoist/_hoist_cli", MODULE, "hoist/__init__.py",
            "hoist/_version.py"]


def needs(elf):
    """The DT_NEEDED names of an ELF file, and its glibc versions."""
    names, glibc = [], []
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            names += [t.needed for t in section.iter_tags()
                      if t.entry.d_tag == "DT_NEEDED"]
        if isinstance(section, GNUVerNeedSection):
            for verneed, auxes in section.iter_versions():
                for aux in auxes:
                    m = re.match(r"GLIBC_(\d+)\.(\d+)", aux.name)
                    if m:
                        glibc.append((int(m[1]), int(m[2])))
    return names, glibc


def check(path):
    problems = []
    with zipfile.ZipFile(path) as wheel:
        files = wheel.namelist()
        inside = {name.rsplit("/", 1)[-1] for name in files}
        for required in REQUIRED:
            if required not in files:
                problems.append(f"{required} is missing")
        if not any(re.match(r"hoist/_hoist\..*\.so$", f) for f in files):
            problems.append("the extension hoist/_hoist.*.so is missing")
        # auditwheel renames what it copies in (libxxhash.so.0 becomes
        # libxxhash-<hash>.so.0.8.1); the old names stay among the strings.
        grafted = {re.sub(r"-[0-9a-f]{8}\.so", ".so", n) for n in inside}
        floor = (2, 0)
        for name in files:
            data = wheel.read(name)
            if not data.startswith(b"\x7fELF"):
                continue
            needed, glibc = needs(ELFFile(io.BytesIO(data)))
            floor = max([floor] + glibc)
            for lib in needed:
                if lib in inside or SYSTEM.match(lib):
                    continue
                if ARROW.match(lib) and name == MODULE:
                    continue
                problems.append(f"{name} needs {lib}, which is neither in "
                                "the wheel nor a system runtime library")
            for match in sorted(set(LIBRARY_NAME.findall(data))):
                lib = match.decode()
                if (lib in inside or SYSTEM.match(lib) or lib in DRIVER or
                        any(g.startswith(lib) for g in grafted) or
                        (ARROW.match(lib) and name == MODULE)):
                    continue
                problems.append(f"{name} names {lib} (loaded with dlopen?), "
                                "which is neither in the wheel nor allowed")
    size = sum(i.file_size for i in zipfile.ZipFile(path).infolist())
    print(f"{path.rsplit('/', 1)[-1]}: {size / 2**20:.1f} MiB unpacked, "
          f"glibc >= {floor[0]}.{floor[1]}")
    for problem in problems:
        print(f"  FAIL: {problem}")
    return not problems


def main(paths):
    if not paths:
        sys.exit(__doc__)
    ok = all([check(p) for p in paths])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
