"""tierd.deepspeed's aio handle: DeepSpeed's semantics and clear errors (a real tierd, no
training), then a small GPT under ZeRO-3 with parameters and optimizer offloaded to `device:
nvme` for 20 steps: through tierd the per-step losses are bit-identical to DeepSpeed's own libaio
handle and to `device: cpu`, also with the pool's RAM quota below the job's swap state, so that
tierd spills to its NVMe tier (label deepspeed)."""
import os
import shutil
import tempfile
import unittest

import ds_testutil as dt
import tierd_testutil as tu

dt.require_deepspeed(aio=True)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402

import tierd  # noqa: E402
import tierd.deepspeed as tds  # noqa: E402

daemon = tu.ModuleDaemon(ram="256M")
SPILL_QUOTA = 48_000_000
setUpModule, tearDownModule = daemon.start, daemon.stop


class HandleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tds.install("handle", socket=daemon.socket, ram_quota=64 << 20)
        cls.dir = tempfile.mkdtemp(prefix="tierd-ds-swap.")

    @classmethod
    def tearDownClass(cls):
        tds.uninstall()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, "zero_stage_3", "optimizer", "rank0", name)

    def test_builder_returns_tierd_handle(self):
        from deepspeed.ops.op_builder import AsyncIOBuilder
        self.assertIs(AsyncIOBuilder().load().aio_handle, tds.AioHandle)
        h = AsyncIOBuilder().load().aio_handle(block_size=1 << 20, queue_depth=8, single_submit=False,
                                               overlap_events=True, intra_op_parallelism=2)
        self.assertEqual((h.get_block_size(), h.get_queue_depth(), h.get_intra_op_parallelism()), (1 << 20, 8, 2))
        self.assertEqual(h.get_alignment(), 1024)

    def test_async_write_read_offsets_and_wait_counts(self):
        h = tds.AioHandle()
        a = torch.arange(1024, dtype=torch.float32)
        b = torch.arange(1024, 2048, dtype=torch.float32)
        p = self.path("x.tensor.swp")
        self.assertEqual(h.async_pwrite(a, p), 0)
        self.assertEqual(h.wait(), 1)
        self.assertEqual(h.async_pwrite(b, p, a.numel() * 4), 0)  # extends the file
        self.assertEqual(h.wait(), 1)
        self.assertEqual(h.wait(), 0)
        out = torch.empty(2048, dtype=torch.float32)
        self.assertEqual(h.async_pread(out, p, 0), 0)
        half = torch.empty(512, dtype=torch.float32)
        self.assertEqual(h.async_pread(half, p, 1536 * 4), 0)  # a partial read at an offset
        self.assertEqual(h.wait(), 2)
        self.assertTrue(torch.equal(out, torch.arange(2048, dtype=torch.float32)))
        self.assertTrue(torch.equal(half, torch.arange(1536, 2048, dtype=torch.float32)))
        self.assertEqual(h.sync_pwrite(half, p, 0), 1)  # overwrite in place
        self.assertEqual(h.sync_pread(out, p), 1)
        self.assertTrue(torch.equal(out[:512], half))
        self.assertTrue(torch.equal(out[512:], torch.arange(512, 2048, dtype=torch.float32)))
        # The bytes are a tensor of the pool, named from the path below zero_stage_3.
        names = [t.name for t in tds.store().client.list_tensors("handle")]
        self.assertIn("swap|zero_stage_3|optimizer|rank0|x.tensor.swp", names)

    def test_read_beyond_written_names_path_and_pool(self):
        h = tds.AioHandle()
        p = self.path("short.tensor.swp")
        h.sync_pwrite(torch.zeros(16, dtype=torch.uint8), p)
        with self.assertRaises(tds.SwapError) as cm:
            h.sync_pread(torch.zeros(32, dtype=torch.uint8), p)
        self.assertIn(p, str(cm.exception))
        self.assertIn("tierd pool handle", str(cm.exception))
        self.assertIn("beyond the 16 bytes written", str(cm.exception))
        h.async_pread(torch.zeros(8, dtype=torch.uint8), self.path("never.tensor.swp"))
        with self.assertRaises(tds.SwapError) as cm:  # an async failure surfaces at wait()
            h.wait()
        self.assertIn("never.tensor.swp", str(cm.exception))

    def test_quota_hit_names_path_and_pool(self):
        h = tds.AioHandle()
        p = self.path("huge.tensor.swp")
        with self.assertRaises(tierd.ResourceExhausted) as cm:
            h.sync_pwrite(torch.zeros(96 << 20, dtype=torch.uint8), p)
        self.assertIn(p, str(cm.exception))
        self.assertIn("tierd pool handle", str(cm.exception))

    def test_pinned_buffers_come_from_the_pool(self):
        h = tds.AioHandle()
        before = tds.store().client.open_pool("handle").ram_used
        t = h.new_cpu_locked_tensor(1 << 18, torch.empty(0, dtype=torch.bfloat16))
        self.assertEqual((t.numel(), t.dtype), (1 << 18, torch.bfloat16))
        self.assertTrue(h.is_pinned(t))
        self.assertTrue(h.is_pinned(t.narrow(0, 1000, 10)))
        self.assertFalse(h.is_pinned(torch.zeros(4)))
        self.assertGreaterEqual(tds.store().client.open_pool("handle").ram_used - before, 1 << 19)
        t.fill_(3)
        p = self.path("from_pinned.tensor.swp")
        self.assertEqual(h.sync_pwrite(t, p), 1)
        self.assertTrue(h.free_cpu_locked_tensor(t))
        self.assertFalse(h.free_cpu_locked_tensor(torch.zeros(4)))
        out = torch.empty(1 << 18, dtype=torch.bfloat16)
        h.sync_pread(out, p)
        self.assertTrue(bool((out == 3).all()))

    def test_no_tierd_is_unavailable_saying_where(self):
        missing = os.path.join(self.dir, "no-such.sock")
        with self.assertRaises(tierd.Unavailable) as cm:
            tds._Store("x", missing, None, None)
        self.assertIn(missing, str(cm.exception))


class TrainingTest(unittest.TestCase):
    def test_losses_bit_identical_to_libaio_and_cpu(self):
        tmp = tempfile.mkdtemp(prefix="tierd-ds-train.")
        spill_daemon = dt.nvme_daemon(ram="512M")
        try:
            common = ["--steps", 20]
            cpu = dt.Job(["--offload", "cpu", *common], tmp=tmp)
            aio = dt.Job(["--offload", "nvme", "--handle", "aio", "--nvme-path", os.path.join(tmp, "aio"),
                          *common], tmp=tmp)
            tdj = dt.Job(["--offload", "nvme", "--handle", "tierd", "--socket", daemon.socket, "--pool", "train",
                          "--nvme-path", os.path.join(tmp, "tierd"), *common], tmp=tmp)
            # The pool's RAM quota below what the job keeps there (21 MB of pinned buffers and
            # 42 MB of swap files): tierd spills swap files to its NVMe tier.
            spill = dt.Job(["--offload", "nvme", "--handle", "tierd", "--socket", spill_daemon.socket,
                            "--pool", "spill", "--ram-quota", SPILL_QUOTA,
                            "--nvme-path", os.path.join(tmp, "spill"), *common], tmp=tmp)
            for job, what in ((cpu, "device cpu"), (aio, "DeepSpeed's aio handle"), (tdj, "tierd"),
                              (spill, "tierd, spilling")):
                job.wait().check(what)
            self.assertEqual(len(cpu.losses()), 20)
            dt.assert_same(aio.losses(), cpu.losses(), "aio vs cpu")
            dt.assert_same(tdj.losses(), aio.losses(), "tierd vs DeepSpeed's aio handle")
            dt.assert_same(spill.losses(), aio.losses(), "tierd spilling to its NVMe tier vs aio")
            swap_bytes = int(dt.field(spill.out(), "swap_bytes"))
            self.assertGreater(int(dt.field(spill.out(), "pinned")) + swap_bytes, SPILL_QUOTA)
            self.assertGreater(int(dt.field(spill.out(), "nvme_used")), 0)
            self.assertLessEqual(int(dt.field(spill.out(), "ram_used")), SPILL_QUOTA)
            # The swap order repeats every step: it became the rank's plan (NVMe tier present).
            self.assertGreater(int(dt.field(spill.out(), "plan")), 0)
            # Nothing went to the swap folder on disk: every swap file is a tensor of the pool.
            files = [f for _r, _d, fs in os.walk(os.path.join(tmp, "tierd")) for f in fs]
            self.assertEqual(files, [])
            self.assertGreater(int(dt.field(tdj.out(), "swap_files")), 8)
            print(f"step: tierd {dt.field(tdj.out(), 'done')} s, aio {dt.field(aio.out(), 'done')} s, "
                  f"cpu {dt.field(cpu.out(), 'done')} s (not asserted)")
        finally:
            spill_daemon.stop()
            shutil.rmtree(spill_daemon.nvme_dir, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
