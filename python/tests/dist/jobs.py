"""The job groups a worker script is given: JOB_ARGS... [JOB_ARGS ...],
each ARG1 ARG2 ARG3 OPTIONS_JSON (the first job's OPTIONS_JSON optional).
Several jobs run one after the other in the same processes, since a launch
and the framework's import cost more than a job here."""
import json
import sys


def job_groups(usage):
    """[(arg1, arg2, arg3, options dict), ...] from sys.argv; exits with
    `usage` when the arguments do not make whole groups."""
    args = sys.argv[1:]
    if len(args) == 3:
        args.append("{}")
    if not args or len(args) % 4:
        sys.exit(f"usage: {usage}")
    return [(*args[at:at + 3], json.loads(args[at + 3]))
            for at in range(0, len(args), 4)]
