"""engine.save_checkpoint / load_checkpoint through tierd (install(checkpoints=True)): a
ZeRO-3 NVMe-offload job saves at step 10 and is killed (kill -9) at step 13; a new process loads
the checkpoint from tierd and trains on. Its first step's loss is bit-identical to the
uninterrupted run's (the weights came back exactly) and every resumed loss is bit-identical to
the same save/kill/load with DeepSpeed's own aio handle and checkpoint engine. (DeepSpeed 0.19
itself does not resume an NVMe-offloaded optimizer bit-identically to an uninterrupted run: see
docs/deepspeed.md.) Then a byte flipped in the NVMe extent of a checkpoint file makes the load
fail with tierd.Corruption naming the file's tensor (label deepspeed)."""
import mmap
import os
import shutil
import tempfile
import unittest

import ds_testutil as dt

dt.require_deepspeed(aio=True)


def flip_first_checkpoint_byte(nvme_dir):
    """Flips one payload byte of the first checkpoint file (tierd.deepspeed's header) found in
    the NVMe tier's data files; returns (file, offset)."""
    for name in sorted(os.listdir(nvme_dir)):
        path = os.path.join(nvme_dir, name)
        if not name.startswith("data-") or not os.path.getsize(path):
            continue
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            at = m.find(b"TIERCKP1")
            if at < 0:
                continue
            m[at + 16 + 100] ^= 0x40
            m.flush()
            return path, at + 16 + 100
    raise AssertionError(f"no checkpoint file on the NVMe tier in {nvme_dir}")


class CheckpointTest(unittest.TestCase):
    def test_save_kill_load_and_a_flipped_byte(self):
        d = dt.nvme_daemon(ram="512M")
        tmp = tempfile.mkdtemp(prefix="tierd-ds-ckpt.")
        try:
            tier = ["--offload", "nvme", "--handle", "tierd", "--socket", d.socket, "--pool", "ckpt",
                    "--nvme-path", os.path.join(tmp, "nvme"), "--checkpoints", "--steps", 20]
            aio = ["--offload", "nvme", "--handle", "aio", "--nvme-path", os.path.join(tmp, "aio"), "--steps", 20]
            t_dir, a_dir = os.path.join(tmp, "ckpt-tierd"), os.path.join(tmp, "ckpt-aio")
            ref = dt.Job(["--offload", "cpu", "--steps", 20], tmp=tmp)
            t_a = dt.Job([*tier, "--save", t_dir, "--save-at", 10, "--kill-at", 13], tmp=tmp)
            a_a = dt.Job([*aio, "--save", a_dir, "--save-at", 10, "--kill-at", 13], tmp=tmp)
            ref.wait().check("uninterrupted")
            for job in (t_a, a_a):
                job.wait()
                self.assertEqual(job.rc(), -9, job.err()[-3000:])
                dt.assert_same(job.losses(), ref.losses()[:13], "before the kill")
            # The checkpoint's bytes are in tierd: on disk only small files saying where.
            model = os.path.join(t_dir, "step10", "zero_pp_rank_0_mp_rank_00_model_states.pt")
            with open(model) as f:
                self.assertIn("its bytes are in tierd", f.read())
            t_b = dt.Job([*tier, "--load", t_dir], tmp=tmp)
            a_b = dt.Job([*aio, "--load", a_dir], tmp=tmp)
            t_b.wait().check("tierd: load")
            a_b.wait().check("aio: load")
            resumed = t_b.losses()
            self.assertEqual([s for s, _ in resumed], list(range(11, 21)))
            self.assertEqual(resumed[0], ref.losses()[10], "the weights of step 10 came back")
            dt.assert_same(resumed, a_b.losses(), "resumed through tierd vs through DeepSpeed's own")

            # A byte flipped in the model file's NVMe extent: the load is an error, not weights.
            import tierd
            c = tierd.connect(d.socket)
            names = [t.name for t in c.list_tensors("ckpt")]
            victim = [n for n in names if n.startswith("ckpt|") and n.endswith("model_states.pt")]
            self.assertEqual(len(victim), 1, names)
            c.evict("ckpt", [c.open_tensor("ckpt", victim[0])])
            self.assertFalse(c.open_tensor("ckpt", victim[0]).in_ram)
            c.close()
            flip_first_checkpoint_byte(d.nvme_dir)
            bad = dt.Job([*tier, "--load", t_dir], tmp=tmp).wait()
            self.assertNotEqual(bad.rc(), 0)
            self.assertEqual(bad.losses(), [])
            err = bad.err()
            self.assertIn("tierd.Corruption", err, err[-3000:])
            self.assertIn(victim[0], err)
            print("the load failed with:", [ln for ln in err.splitlines() if "tierd.Corruption" in ln][-1])
        finally:
            d.stop()
            shutil.rmtree(d.nvme_dir, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
