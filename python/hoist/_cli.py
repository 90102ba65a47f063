"""The `hoist` command of the Python package: the C++ CLI (ls, inspect,
verify, rm, export, import, plan, demo), shipped in the package as
hoist/_hoist_cli and run in this process's place."""

import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "_hoist_cli")
    if not os.access(exe, os.X_OK):
        sys.exit(f"hoist: {exe} is missing or not executable: this "
                 "installation of hoist is incomplete; reinstall it")
    os.execv(exe, ["hoist", *sys.argv[1:]])


if __name__ == "__main__":
    main()
