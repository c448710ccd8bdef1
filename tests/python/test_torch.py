"""PyTorch through the tierd module against a real tierd:

- a tensor written through the binding (torch.frombuffer view of a write lease) is read back
  bit-exact by the C++ client (tier_read_tensor, and tierctl get when built);
- a small training loop (MLP, torch.optim.Adam) whose parameters and optimizer state
  (exp_avg, exp_avg_sq, step) are views over leased arena memory: the loss falls, the run matches
  the same run with private memory, the state another client reads is the optimizer's, and a
  process that dies mid-run (SIGKILL) is resumed by a new process from the state in tierd.

Run by ctest with /usr/bin/python3; exit code 77 means skipped."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402

tierd = tu.import_tierd()
try:
    import torch
except ImportError:
    tu.skip("torch is not installed for this interpreter (apt-get install python3-torch)")

torch.set_num_threads(1)
STEPS = 40
CRASH_AFTER = 15
daemon = tu.ModuleDaemon()
setUpModule, tearDownModule = daemon.start, daemon.stop


def read_with_cxx(socket, pool, name):
    exe = tu.bin_path("tier_read_tensor")
    if not os.access(exe, os.X_OK):
        raise unittest.SkipTest(f"{exe} is not built")
    with tempfile.NamedTemporaryFile() as out:
        subprocess.run([exe, socket, pool, name, out.name], check=True, timeout=30)
        with open(out.name, "rb") as f:
            return f.read()


def tensor_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# --- the training problem: identical in every process --------------------------------------
def make_data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(256, 1, generator=g)
    return x, y


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def run_steps(model, opt, x, y, n):
    losses = []
    for _ in range(n):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


KINDS = ("param", "exp_avg", "exp_avg_sq", "step")


class TierState:
    """Every parameter and its Adam state as torch views over write leases of tierd tensors
    '<param name>.<kind>'. fresh: create and initialise them; else open what a previous
    process left (waiting up to 10 s for its leases to go away)."""

    def __init__(self, client, pool, model, opt, fresh):
        self.leases = {}
        self.views = {}
        for pname, p in model.named_parameters():
            views = {}
            for kind in KINDS:
                tname = f"{pname}.{kind}"
                shape = tuple(p.shape) if kind != "step" else (1,)
                if fresh:
                    info = client.create_tensor(pool, tname, shape=shape, dtype=torch.float32)
                else:
                    info = client.open_tensor(pool, tname)
                lease = client.lease(info, "w", timeout=10)
                self.leases[tname] = lease
                v = lease.torch()
                views[kind] = v.reshape(()) if kind == "step" else v
            if fresh:
                views["param"].copy_(p.detach())
                for kind in ("exp_avg", "exp_avg_sq", "step"):
                    views[kind].zero_()
            p.data = views["param"]
            opt.state[p] = {"step": views["step"], "exp_avg": views["exp_avg"],
                            "exp_avg_sq": views["exp_avg_sq"]}
            self.views[pname] = views

    def still_arena_views(self, model, opt):
        """True when the optimizer still updates the leased memory in place."""
        for pname, p in model.named_parameters():
            for kind in ("exp_avg", "exp_avg_sq"):
                if opt.state[p][kind].data_ptr() != self.leases[f"{pname}.{kind}"].address:
                    return False
            if p.data_ptr() != self.leases[f"{pname}.param"].address:
                return False
        return True

    def release(self):
        for lease in self.leases.values():
            lease.release()


def reference_run():
    x, y = make_data()
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = run_steps(model, opt, x, y, STEPS)
    state = {}
    for pname, p in model.named_parameters():
        st = opt.state[p]
        state[pname] = {"param": p.detach().clone(), "exp_avg": st["exp_avg"].clone(),
                        "exp_avg_sq": st["exp_avg_sq"].clone(), "step": float(st["step"])}
    return losses, state


def child_main(socket, pool):
    """Trains CRASH_AFTER steps with state in tierd, prints the losses, then dies by SIGKILL
    without releasing anything."""
    c = tierd.connect(socket)
    c.create_pool(pool)
    x, y = make_data()
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    TierState(c, pool, model, opt, fresh=True)
    losses = run_steps(model, opt, x, y, CRASH_AFTER)
    print(json.dumps(losses), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class RoundTrip(unittest.TestCase):
    def setUp(self):
        self.c = tierd.connect(daemon.socket)
        self.c.create_pool("py-torch", exist_ok=True)

    def tearDown(self):
        self.c.drop_pool("py-torch")
        self.c.close()

    def check_dtype(self, name, dtype):
        g = torch.Generator().manual_seed(99)
        src = (torch.randn(37, 129, generator=g) * 1e3).to(dtype)
        info = self.c.create_tensor("py-torch", name, shape=tuple(src.shape), dtype=dtype)
        self.assertEqual(info.size, src.numel() * src.element_size())
        with self.c.lease(info, "w") as lease:
            view = lease.torch()
            self.assertEqual(view.dtype, dtype)
            self.assertEqual(tuple(view.shape), tuple(src.shape))
            self.assertEqual(view.data_ptr(), lease.address)
            view.copy_(src)
            del view
        got = read_with_cxx(daemon.socket, "py-torch", name)
        self.assertEqual(len(got), info.size)
        self.assertEqual(got, tensor_bytes(src))
        tierctl = tu.bin_path("tierctl")
        if os.access(tierctl, os.X_OK):
            with tempfile.NamedTemporaryFile() as out:
                subprocess.run([tierctl, "--socket", daemon.socket, "get", "py-torch", name, out.name],
                               check=True, timeout=30, stdout=subprocess.DEVNULL)
                with open(out.name, "rb") as f:
                    self.assertEqual(f.read(), tensor_bytes(src))

    def test_float32_bit_exact(self):
        self.check_dtype("f32", torch.float32)

    def test_bfloat16_bit_exact(self):
        self.check_dtype("bf16", torch.bfloat16)

    def test_float16_bit_exact(self):
        self.check_dtype("f16", torch.float16)


class DLPack(unittest.TestCase):
    def test_from_dlpack_is_zero_copy_with_the_tensors_dtype_and_shape(self):
        import gc
        c = tierd.connect(daemon.socket)
        c.create_pool("py-dlpack", exist_ok=True)
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            name = str(dtype).split(".")[1]
            t = c.create_tensor("py-dlpack", name, shape=(3, 4), dtype=dtype, exist_ok=True)
            with c.lease(t, "w") as lease:
                self.assertEqual(lease.__dlpack_device__(), (1, 0))  # kDLCPU
                x = torch.from_dlpack(lease)
                self.assertEqual((x.dtype, tuple(x.shape)), (dtype, (3, 4)))
                self.assertEqual(x.data_ptr(), lease.address)
                x.copy_(torch.arange(12).view(3, 4).to(dtype))
                with self.assertRaises(BufferError):  # the DLPack tensor counts as a view
                    lease.release()
                del x
                gc.collect()
                self.assertEqual(lease.exports, 0)
            with c.lease(t, "r") as lease:
                self.assertTrue(torch.equal(lease.torch(), torch.arange(12).view(3, 4).to(dtype)))
        with self.assertRaises(BufferError):
            lease.__dlpack__()  # released
        c.close()


class AdamStateInTierd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref_losses, cls.ref_state = reference_run()

    def setUp(self):
        self.c = tierd.connect(daemon.socket)

    def tearDown(self):
        self.c.close()

    def check_against_reference(self, losses, state_views):
        self.assertEqual(len(losses), STEPS)
        self.assertLess(losses[-1], 0.5 * losses[0], f"loss did not fall: {losses}")
        for a, b in zip(losses, self.ref_losses):
            self.assertAlmostEqual(a, b, delta=1e-6 * max(1.0, abs(b)))
        for pname, ref in self.ref_state.items():
            for kind in ("param", "exp_avg", "exp_avg_sq"):
                self.assertTrue(torch.allclose(state_views[pname][kind], ref[kind], rtol=1e-5, atol=1e-7),
                                f"{pname}.{kind}")
            self.assertEqual(float(state_views[pname]["step"]), ref["step"])

    def check_stored_state(self, pool, expected):
        """What another client reads from tierd is the optimizer's state, bit for bit."""
        reader = tierd.connect(daemon.socket)
        for tname, want in expected.items():
            info = reader.open_tensor(pool, tname)
            with reader.lease(info, "r", timeout=10) as lease:
                got = bytes(memoryview(lease))
            self.assertEqual(got, want, tname)
        reader.close()
        name = next(iter(expected))
        self.assertEqual(read_with_cxx(daemon.socket, pool, name), expected[name])

    def test_state_lives_in_leased_arena_memory(self):
        pool = "py-adam"
        self.c.create_pool(pool)
        x, y = make_data()
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        ts = TierState(self.c, pool, model, opt, fresh=True)
        losses = []
        for _ in range(STEPS):
            losses += run_steps(model, opt, x, y, 1)
            self.assertTrue(ts.still_arena_views(model, opt), "optimizer state left the arena")
        self.check_against_reference(losses, ts.views)
        expected = {f"{pname}.{kind}": tensor_bytes(v) for pname, views in ts.views.items()
                    for kind, v in views.items()}
        del opt, model
        ts.views = None
        ts.release()
        self.check_stored_state(pool, expected)
        self.c.drop_pool(pool)

    def test_resume_after_crash(self):
        pool = "py-adam-crash"
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", daemon.socket, pool],
                               capture_output=True, text=True, timeout=120)
        self.assertEqual(child.returncode, -signal.SIGKILL, child.stderr)
        losses = json.loads(child.stdout.strip().splitlines()[-1])
        self.assertEqual(len(losses), CRASH_AFTER)
        # A new process: a fresh model and optimizer, everything else from tierd.
        x, y = make_data()
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        ts = TierState(self.c, pool, model, opt, fresh=False)
        self.assertEqual(int(ts.views["0.weight"]["step"]), CRASH_AFTER)
        losses += run_steps(model, opt, x, y, STEPS - CRASH_AFTER)
        self.check_against_reference(losses, ts.views)
        del opt, model
        ts.views = None
        ts.release()
        self.c.drop_pool(pool)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_main(sys.argv[2], sys.argv[3])
    unittest.main(verbosity=2)
