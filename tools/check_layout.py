#!/usr/bin/env python3
"""Checks of the source tree's layout that the compiler cannot make.

  boundary    the clients (the Python binding, python/src/, and the CLI,
              src/hoist/tools/) include only the public API (include/hoist/)
              and their own headers; the CLI also the base utilities and its
              sample model (src/hoist/base/, src/hoist/model/). What a
              client needs of a module's private header belongs in
              include/hoist/ (docs/architecture.md).
  file-size   no source file of the library or the binding (src/,
              python/src/; tests aside) is longer than 700 lines: a file
              that grows past it does more than one job and is split by
              responsibility.

Usage: check_layout.py [--root DIR] [boundary|file-size ...]
(no check named: both). Prints each violation as FILE:LINE: what; exits 1
if there is any, 0 otherwise.
"""
import argparse
import pathlib
import re
import sys

MAX_LINES = 700

# Client directory -> the private include prefixes it may use besides the
# public headers ("hoist/NAME.h") and its own directory's.
CLIENTS = {
    "python/src": (),
    "src/hoist/tools": ("hoist/tools/", "hoist/base/", "hoist/model/"),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
PUBLIC = re.compile(r"^hoist/[A-Za-z0-9_]+\.h$")
SOURCES = ("*.cc", "*.h", "*.cu", "*.cuh")


def sources(directory):
    for pattern in SOURCES:
        yield from sorted(directory.rglob(pattern))


def check_boundary(root):
    problems = []
    for client, allowed in CLIENTS.items():
        directory = root / client
        for path in sources(directory):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                header = match.group(1)
                if not header.startswith("hoist/"):
                    continue  # a third party's, or a client's own
                if PUBLIC.match(header) and \
                        (root / "include" / header).is_file():
                    continue
                if header.startswith(allowed):
                    continue
                problems.append(
                    f"{path.relative_to(root)}:{number}: includes the private "
                    f"header \"{header}\" (a client of the library uses "
                    "include/hoist/ only: make what it needs public API)")
    return problems


def check_file_size(root):
    problems = []
    for top in ("src", "python/src"):
        for path in sources(root / top):
            if path.stem.endswith("_test") or path.suffix not in (".cc", ".cu"):
                continue
            count = len(path.read_text(encoding="utf-8").splitlines())
            if count > MAX_LINES:
                problems.append(
                    f"{path.relative_to(root)}:{count}: {count} lines, over "
                    f"{MAX_LINES}: split it by responsibility")
    return problems


CHECKS = {"boundary": check_boundary, "file-size": check_file_size}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checks", nargs="*", metavar="CHECK",
                        help="boundary, file-size (default: both)")
    parser.add_argument("--root", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[1],
                        help="the repository's root (default: this script's)")
    args = parser.parse_args(argv)
    names = args.checks or list(CHECKS)
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        parser.error(f"no check {', '.join(unknown)}: "
                     f"use {', '.join(CHECKS)}")
    failed = 0
    for name in names:
        problems = CHECKS[name](args.root)
        for problem in problems:
            print(problem)
        print(f"check_layout {name}: "
              f"{'ok' if not problems else f'{len(problems)} problem(s)'}",
              file=sys.stderr)
        failed += len(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
