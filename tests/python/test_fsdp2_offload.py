"""tierd.torch.OffloadAdamW over FSDP2 (fully_shard, DTensor parameters): 2 ranks, CPU, gloo.

Against torch.optim.AdamW on the same FSDP2 model and batches: both compute the same update in
float32 in a different order (see test_offload_adamw.py: a few ulps per element per step, fed
back through the gradients), so each step's loss agrees within a relative 1e-5 over 20 steps.
After kill -9 of one or all ranks (inside step() at fault-injection points, and at random
instants from outside), every rank resumes with resume=True and the remaining losses are
bit-identical to an uninterrupted run's.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402
import torch2_testutil as t2  # noqa: E402

tierd = tu.import_tierd()
t2.require_torch2()

STEPS = 20
WORLD = 2
daemon = tu.ModuleDaemon(ram="256M")
setUpModule, tearDownModule = daemon.start, daemon.stop


def losses(job, rank):
    return {r["step"]: r["loss"] for r in job.results(rank) if "step" in r}


class Fsdp2OffloadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # OffloadAdamW (pool "ref"), torch.optim.AdamW and OffloadAdamW under CPUOffloadPolicy,
        # side by side in each rank on the same batches.
        cls.ref = t2.Job(WORLD, "compare", daemon.socket, "ref", steps=STEPS).check()

    def test_losses_match_torch_adamw(self):
        for rank in range(WORLD):
            rows = [r for r in self.ref.results(rank) if "step" in r]
            self.assertEqual([r["step"] for r in rows], list(range(1, STEPS + 1)))
            for r in rows:
                self.assertAlmostEqual(r["loss"], r["adamw"], delta=1e-5 * abs(r["adamw"]),
                                       msg=f"rank {rank} step {r['step']}")
        # (AdamW moves the parameters at every step, so a step OffloadAdamW skipped or got wrong
        # would show in the next step's loss far beyond 1e-5.)

    def test_cpu_offload_policy(self):
        for rank in range(WORLD):
            for r in self.ref.results(rank):
                if "step" in r:  # the same arithmetic on the same shards in host memory: bit-identical
                    self.assertEqual(r["cpu_offload"], r["loss"], f"rank {rank} step {r['step']}")

    def test_kill9_and_resume_bit_identical(self):
        units = 6  # 3 Linear layers: a weight and a bias each
        for trial, plan in enumerate(t2.random_kill_plans(35, 5, STEPS, WORLD, units)):
            with self.subTest(trial=trial, plan=plan):
                pool = f"kill{trial}"
                job = t2.Job(WORLD, "train", daemon.socket, pool, steps=STEPS, env=plan.get("env"))
                codes = job.wait(kill_after=plan.get("kill_after"))
                if "env" in plan:
                    self.assertIn(-9, codes, f"the fault-injection point did not fire: {codes}")
                again = t2.Job(WORLD, "train", daemon.socket, pool, steps=STEPS, resume=True).check()
                starts = [again.value(r, "resumed")[0] for r in range(WORLD)]
                self.assertEqual(len(set(starts)), 1, starts)  # the ranks agree on the step
                for rank in range(WORLD):
                    got, want = losses(again, rank), losses(self.ref, rank)
                    self.assertEqual(sorted(got), list(range(starts[0] + 1, STEPS + 1)))
                    for step, loss in got.items():
                        self.assertEqual(loss, want[step], f"rank {rank} step {step} after resuming at {starts[0]}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
