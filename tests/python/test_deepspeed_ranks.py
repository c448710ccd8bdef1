"""Two ranks on one node (torch.distributed, gloo) share one tierd pool: ZeRO-3 with parameters
and optimizer on `device: nvme` through tierd, 20 steps, each rank's losses bit-identical to the
same two-rank job with `device: cpu`; both ranks' swap files and pinned buffers are in the one
pool (label deepspeed)."""
import json
import os
import shutil
import tempfile
import unittest

import ds_testutil as dt
import tierd_testutil as tu

dt.require_deepspeed()


class RanksTest(unittest.TestCase):
    def test_two_ranks_share_one_pool(self):
        d = tu.Daemon(ram="512M")
        tmp = tempfile.mkdtemp(prefix="tierd-ds-ranks.")
        try:
            cpu = dt.Job(["--offload", "cpu", "--steps", 20], world=2, tmp=tmp)
            tdj = dt.Job(["--offload", "nvme", "--handle", "tierd", "--socket", d.socket, "--pool", "shared",
                          "--nvme-path", os.path.join(tmp, "nvme"), "--steps", 20,
                          "--rss", os.path.join(tmp, "rss")], world=2, tmp=tmp)
            cpu.wait().check("device cpu, 2 ranks")
            tdj.wait().check("tierd, 2 ranks")
            for r in range(2):
                self.assertEqual(len(cpu.losses(r)), 20)
                dt.assert_same(tdj.losses(r), cpu.losses(r), f"rank {r}: tierd vs cpu")
            self.assertNotEqual(cpu.losses(0), cpu.losses(1))  # the ranks saw different batches
            import tierd
            c = tierd.connect(d.socket)
            names = [t.name for t in c.list_tensors("shared")]
            for r in range(2):
                self.assertTrue(any(n.startswith(f"swap|zero_stage_3|optimizer|rank{r}|") for n in names), names)
            pinned = [int(dt.field(tdj.out(r), "pinned")) for r in range(2)]
            self.assertTrue(all(p > 0 for p in pinned))
            print(f"pinned swap buffers per rank (bytes, in the pool): {pinned}")
            for r in range(2):
                with open(os.path.join(tmp, f"rss.{r}")) as f:
                    print(f"rank {r} memory at the end (bytes): {json.load(f)}")
        finally:
            d.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
