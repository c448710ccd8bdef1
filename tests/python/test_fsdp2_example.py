"""python/examples/fsdp2_train.py under torchrun (2 ranks, gloo): it trains, checkpoints through
DCP into tierd, and after a SIGKILL of every process mid-run, --resume continues with losses
bit-identical to an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402
import torch2_testutil as t2  # noqa: E402

tu.import_tierd()
t2.require_torch2()

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "python", "examples", "fsdp2_train.py")
STEPS = 8
daemon = tu.ModuleDaemon(ram="256M")
setUpModule, tearDownModule = daemon.start, daemon.stop


def torchrun(pool, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           EXAMPLE, "--pool", pool, "--socket", daemon.socket, "--steps", str(STEPS), "--ckpt-every", "3",
           "--layers", "1", "--dim", "32", "--heads", "2", "--seq", "16", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def lines(text):
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


class ExampleTest(unittest.TestCase):
    def test_train_checkpoint_kill_resume(self):
        ref = torchrun("ex-ref")
        out, err = ref.communicate(timeout=240)
        self.assertEqual(ref.returncode, 0, err)
        ref_lines = lines(out)
        want = {x["step"]: x["loss"] for x in ref_lines if "step" in x}
        self.assertEqual(sorted(want), list(range(1, STEPS + 1)))
        self.assertEqual(ref_lines[-1]["checkpoints"], ["step6", "step8"])  # --keep 2
        self.assertEqual(len([x for x in ref_lines if "checkpoint" in x]), 3)

        job = torchrun("ex-kill")
        for line in job.stdout:
            if line.startswith("{") and json.loads(line).get("step") == 4:
                os.killpg(job.pid, signal.SIGKILL)
                break
        job.wait(60)
        job.stdout.close()
        job.stderr.close()
        again = torchrun("ex-kill", "--resume")
        out, err = again.communicate(timeout=240)
        self.assertEqual(again.returncode, 0, err)
        got = lines(out)
        start = got[0]["resumed_step"]
        self.assertGreaterEqual(start, 3)  # step 4 was printed after its commit on rank 0
        steps = {x["step"]: x["loss"] for x in got if "step" in x}
        self.assertEqual(sorted(steps), list(range(start + 1, STEPS + 1)))
        for step, loss in steps.items():
            self.assertEqual(loss, want[step], f"step {step}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
