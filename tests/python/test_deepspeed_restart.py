"""tierd killed (kill -9) and restarted in the middle of a ZeRO-3 NVMe-offload run through
tierd: the job goes on and its 20 losses are bit-identical to an uninterrupted `device: cpu`
run, or it stops with an error that names tierd; never a wrong loss (label deepspeed)."""
import os
import shutil
import tempfile
import unittest

import ds_testutil as dt
import tierd_testutil as tu

dt.require_deepspeed()


class RestartTest(unittest.TestCase):
    def test_kill_9_of_tierd_mid_run(self):
        d = dt.nvme_daemon(ram="512M")
        tmp = tempfile.mkdtemp(prefix="tierd-ds-restart.")
        try:
            ref = dt.Job(["--offload", "cpu", "--steps", 20], tmp=tmp)
            job = dt.Job(["--offload", "nvme", "--handle", "tierd", "--socket", d.socket, "--pool", "restart",
                          "--nvme-path", os.path.join(tmp, "nvme"), "--steps", 20], tmp=tmp)
            before = dt.wait_for_line(job.procs[0], r"^loss 5 ")
            dt.kill_and_restart(d)
            job.wait()
            ref.wait().check("device cpu")
            got = dt.losses("".join(before) + job.out())
            want = ref.losses()
            self.assertEqual(len(want), 20)
            if job.rc() == 0:
                dt.assert_same(got, want, "through a tierd restart")
                print("the job went on through the restart with the right losses")
            else:
                self.assertIn("tierd", job.err(), job.err()[-3000:])
                dt.assert_same(got, want[:len(got)], "the steps before the error")
                print(f"the job stopped after {len(got)} steps: {job.err().strip().splitlines()[-1]}")
        finally:
            d.stop()
            shutil.rmtree(d.nvme_dir, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
