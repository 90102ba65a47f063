"""A save killed with SIGKILL mid-write leaves the previous steps intact."""
import signal
import subprocess
import sys
import textwrap

import numpy as np

import hoist

SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    import hoist

    root, start = sys.argv[1], int(sys.argv[2])
    mgr = hoist.CheckpointManager(root, keep=3, pool_bytes=16 << 20)
    step = start
    while True:
        rng = np.random.default_rng(step)
        state = {"w": rng.standard_normal((2048, 1024), dtype=np.float32),
                 "b": rng.standard_normal(1000, dtype=np.float32),
                 "step": step}
        handle = mgr.save(step, state)  # returns once staged
        print("staged", step, flush=True)  # writing now
        handle.wait()
        print("committed", step, flush=True)
        step += 1
""")


def expected(step):
    rng = np.random.default_rng(step)
    return (rng.standard_normal((2048, 1024), dtype=np.float32),
            rng.standard_normal(1000, dtype=np.float32))


def test_sigkill_mid_save_leaves_committed_steps_restorable(root, tmp_path):
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    start, acknowledged = 1, 0
    for kill in range(4):
        child = subprocess.Popen([sys.executable, str(script), str(root),
                                  str(start)], stdout=subprocess.PIPE,
                                 text=True)
        # Kill while a save is writing: after its "staged" line, the kill-th
        # save after the first commit.
        saves_after_commit = -1
        for line in child.stdout:
            what, step = line.split()
            if what == "committed":
                acknowledged = max(acknowledged, int(step))
                saves_after_commit = max(saves_after_commit, 0)
            elif saves_after_commit >= 0:
                if saves_after_commit == kill:
                    break
                saves_after_commit += 1
        child.send_signal(signal.SIGKILL)
        child.wait()
        for line in child.stdout:  # lines written before it died
            what, step = line.split()
            if what == "committed":
                acknowledged = max(acknowledged, int(step))
        assert acknowledged > 0
        with hoist.CheckpointManager(root, keep=3, pool_bytes=16 << 20) as mgr:
            steps = mgr.steps
            assert steps and steps[-1] >= acknowledged, (kill, steps)
            for step in steps:
                out = mgr.restore(step)
                w, b = expected(step)
                assert out["step"] == step
                assert np.array_equal(out["w"], w), (kill, step)
                assert np.array_equal(out["b"], b), (kill, step)
        leftovers = [p.name for p in root.iterdir() if ".tmp-" in p.name]
        assert leftovers == [], leftovers  # the reopen cleaned up
        start = steps[-1] + 1
