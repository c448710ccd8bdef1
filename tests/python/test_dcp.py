"""tierd.torch.checkpoint: torch.distributed.checkpoint through TierdWriter / TierdReader.

FSDP2 ranks on the CPU with gloo (tests/python/fsdp2_worker.py) against a real tierd: a save
from 2 ranks loaded into 2 (every local shard bit-identical), into 4 and into one unsharded
process (equal to the full state dict); a kill -9 during a save; list / delete / keep-newest;
a flipped byte; another uid; async_save overlapping training steps.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402
import torch2_testutil as t2  # noqa: E402

tierd = tu.import_tierd()
t2.require_torch2()
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from tierd.torch import checkpoint as ck  # noqa: E402
import fsdp2_worker as w  # noqa: E402

daemon = tu.ModuleDaemon(ram="256M")
setUpModule, tearDownModule = daemon.start, daemon.stop


def shard_of(full, rank, world):
    """FSDP2's dim-0 shard of a full tensor: torch.chunk, ranks past the last chunk empty."""
    chunks = torch.tensor(full).chunk(world, dim=0)
    return chunks[rank].tolist() if rank < len(chunks) else []


def ckpt_tensors(pool):
    with tierd.connect(daemon.socket) as c:
        return sorted(t.name for t in c.list_tensors(pool) if t.name.startswith("dcp|"))


class DcpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.saved = t2.Job(2, "save", daemon.socket, "dcp", ckpt="step3").check()
        cls.full = cls.saved.value(0, "full")[0]

    def test_load_same_world_bit_identical(self):
        job = t2.Job(2, "load", daemon.socket, "dcp", ckpt="step3").check()
        for rank in range(2):
            self.assertEqual(job.value(rank, "local")[0], self.saved.value(rank, "local")[0], f"rank {rank}")

    def test_load_resharded_to_four(self):
        job = t2.Job(4, "load", daemon.socket, "dcp", ckpt="step3").check()
        for rank in range(4):
            got = job.value(rank, "local")[0]
            for k, full in self.full.items():
                self.assertEqual(got[k], shard_of(full, rank, 4), f"rank {rank} {k}")

    def test_load_unsharded_one_process(self):
        model = w.make_model(99)
        sd = model.state_dict()
        dcp.load(sd, storage_reader=ck.TierdReader("dcp", socket=daemon.socket), checkpoint_id="step3")
        for k, full in self.full.items():
            self.assertTrue(torch.equal(sd[k], torch.tensor(full)), k)

    def test_missing_checkpoint_is_a_clear_error(self):
        with self.assertRaisesRegex(tierd.NotFound, "no checkpoint 'nope'"):
            dcp.load(w.make_model(1).state_dict(), storage_reader=ck.TierdReader("dcp", socket=daemon.socket),
                     checkpoint_id="nope")

    def test_kill_during_save_leaves_previous_and_is_reclaimed(self):
        pool = "dcp-kill"
        t2.Job(2, "save", daemon.socket, pool, ckpt="good").check()
        ck.reclaim(pool, socket=daemon.socket)  # the lock tensors the good save left
        before = ckpt_tensors(pool)
        self.assertEqual(len(before), 3, before)  # its record and each rank's data
        for where in ("data", "meta"):
            job = t2.Job(2, "save", daemon.socket, pool, ckpt="half", env={"TIERD_DCP_KILL_AT": where})
            self.assertIn(-9, job.wait(), where)
            self.assertEqual([i.checkpoint_id for i in ck.list_checkpoints(pool, socket=daemon.socket)], ["good"])
            self.assertGreater(len(ckpt_tensors(pool)), len(before), f"{where}: the dead save wrote nothing")
            ck.reclaim(pool, socket=daemon.socket)
            self.assertEqual(ckpt_tensors(pool), before, f"{where}: the dead save's tensors are still there")
        model = w.make_model(99)
        sd = model.state_dict()
        dcp.load(sd, storage_reader=ck.TierdReader(pool, socket=daemon.socket), checkpoint_id="good")
        for k, full in self.full.items():
            self.assertTrue(torch.equal(sd[k], torch.tensor(full)), k)

    def test_list_delete_keep_newest_and_resave(self):
        pool = "dcp-manage"
        sd = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16),
              "meta": {"step": 7, "name": "x"}}
        for i in range(4):
            sd["w"] += 1
            dcp.save(sd, storage_writer=ck.TierdWriter(pool, socket=daemon.socket), checkpoint_id=f"c{i}")
        self.assertEqual([i.checkpoint_id for i in ck.list_checkpoints(pool, socket=daemon.socket)],
                         ["c0", "c1", "c2", "c3"])
        self.assertTrue(ck.delete_checkpoint(pool, "c1", socket=daemon.socket))
        self.assertFalse(ck.delete_checkpoint(pool, "c1", socket=daemon.socket))
        self.assertEqual(ck.keep_newest(pool, 1, socket=daemon.socket), ["c0", "c2"])
        infos = ck.list_checkpoints(pool, socket=daemon.socket)
        self.assertEqual([i.checkpoint_id for i in infos], ["c3"])
        self.assertEqual(len({n.split("|")[1] for n in ckpt_tensors(pool)}), 1)  # one save's tensors left
        # saving c3 again replaces it; the load sees the new values, the old tensors are gone
        sd["w"] += 100
        dcp.save(sd, storage_writer=ck.TierdWriter(pool, socket=daemon.socket, keep=5, snapshot=True),
                 checkpoint_id="c3")
        ck.reclaim(pool, socket=daemon.socket)
        back = {"w": torch.zeros(1000), "b": torch.zeros(3, dtype=torch.bfloat16), "meta": {"step": 0, "name": ""}}
        dcp.load(back, storage_reader=ck.TierdReader(pool, socket=daemon.socket))  # the newest
        self.assertTrue(torch.equal(back["w"], sd["w"]))
        self.assertTrue(torch.equal(back["b"], sd["b"]))
        self.assertEqual(back["meta"], {"step": 7, "name": "x"})
        self.assertEqual(len({n.split("|")[1] for n in ckpt_tensors(pool)}), 1)

    def test_flipped_byte_names_the_tensor(self):
        pool = "dcp-flip"
        sd = {"layer.weight": torch.randn(64, 64), "layer.bias": torch.randn(64)}
        dcp.save(sd, storage_writer=ck.TierdWriter(pool, socket=daemon.socket), checkpoint_id="a")
        rec = next(iter(ck.Store(pool, daemon.socket, "test").records().values()))
        st = next(v for k, v in rec["metadata"].storage_data.items() if k.fqn == "layer.weight")
        with tierd.connect(daemon.socket) as c:
            with c.lease(c.open_tensor(pool, st.tensor), "w") as lease:
                lease.numpy()[st.offset + 100] ^= 0x10
        back = {k: torch.zeros_like(v) for k, v in sd.items()}
        # DCP wraps a rank's error in CheckpointException (a BaseException) with its message
        with self.assertRaisesRegex(BaseException, r"item 'layer.weight'.*fails its checksum"):
            dcp.load(back, storage_reader=ck.TierdReader(pool, socket=daemon.socket), checkpoint_id="a")

    @unittest.skipUnless(os.getuid() == 0, "needs root to run a process as another uid")
    def test_another_uid_is_refused(self):
        os.chmod(daemon.dir, 0o755)
        os.chmod(daemon.socket, 0o777)
        code = ("import sys, torch, torch.distributed.checkpoint as dcp, tierd\n"
                "from tierd.torch.checkpoint import TierdReader, TierdWriter\n"
                "sd = {'x': torch.zeros(3)}\n"
                "for op in ('load', 'save'):\n"
                "    try:\n"
                "        if op == 'load': dcp.load(sd, storage_reader=TierdReader('dcp', socket=sys.argv[1]),"
                " checkpoint_id='step3')\n"
                "        else: dcp.save(sd, storage_writer=TierdWriter('dcp', socket=sys.argv[1]),"
                " checkpoint_id='step3')\n"
                "        print(op, 'ALLOWED')\n"
                "    except tierd.PermissionDenied as e:\n"
                "        print(op, 'REFUSED', e)\n")  # raised by reset(), before DCP's collectives
        import subprocess
        r = subprocess.run([sys.executable, "-c", code, daemon.socket], capture_output=True, text=True,
                           preexec_fn=lambda: os.setuid(65534), timeout=120, cwd="/")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("load REFUSED PermissionDenied: pool 'dcp' belongs to uid 0", r.stdout, r.stdout + r.stderr)
        self.assertIn("save REFUSED PermissionDenied: pool 'dcp' belongs to uid 0", r.stdout, r.stdout + r.stderr)
        self.assertEqual([i.checkpoint_id for i in ck.list_checkpoints("dcp", socket=daemon.socket)], ["step3"])

    def test_async_save_overlapping_training(self):
        job = t2.Job(2, "async", daemon.socket, "dcp-async").check()
        for rank in range(2):
            at3, loaded, now = job.value(rank, "at3")[0], job.value(rank, "loaded")[0], job.value(rank, "now")[0]
            self.assertEqual(loaded, at3, f"rank {rank}")
            self.assertNotEqual(now, at3)  # training went on meanwhile
        # The save recorded the tensors where stage() had copied them: no second copy.
        rec = next(iter(ck.Store("dcp-async", daemon.socket, "test").records().values()))
        places = {v.tensor.split("|")[2] for v in rec["metadata"].storage_data.values() if v.dtype is not None}
        self.assertEqual(places, {"stage.r0", "stage.r1"})


if __name__ == "__main__":
    unittest.main(verbosity=2)
