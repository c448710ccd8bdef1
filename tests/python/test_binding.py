"""The tierd Python module against a real tierd: errors, pools, tensors, leases and the buffer
protocol (numpy views are zero-copy, read leases are read-only, release refuses while views
live). Run by ctest with /usr/bin/python3; exit code 77 means skipped."""
import gc
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402

tierd = tu.import_tierd()
try:
    import numpy as np
except ImportError:
    np = None

daemon = tu.ModuleDaemon()
setUpModule, tearDownModule = daemon.start, daemon.stop


class Errors(unittest.TestCase):
    def test_no_daemon_is_unavailable(self):
        with self.assertRaises(tierd.Unavailable) as cm:
            tierd.connect(os.path.join(daemon.dir, "nobody-here.sock"))
        e = cm.exception
        self.assertIsInstance(e, tierd.Error)
        self.assertEqual(e.code, "Unavailable")
        self.assertEqual(e.code_value, 11)
        self.assertIn("nobody-here.sock", e.message)

    def test_every_code_has_a_subclass(self):
        for name in ("InvalidArgument", "NotFound", "AlreadyExists", "PermissionDenied",
                     "ResourceExhausted", "Busy", "Timeout", "IoError", "Corruption",
                     "ProtocolError", "Unavailable", "Unsupported", "Internal"):
            self.assertTrue(issubclass(getattr(tierd, name), tierd.Error), name)

    def test_errors_also_derive_from_the_matching_builtins(self):
        for name, builtin in (("PermissionDenied", PermissionError), ("NotFound", LookupError),
                              ("Unavailable", ConnectionError), ("Timeout", TimeoutError),
                              ("InvalidArgument", ValueError), ("IoError", OSError),
                              ("AlreadyExists", FileExistsError)):
            self.assertTrue(issubclass(getattr(tierd, name), builtin), name)
        # No class of the module shadows a builtin name (tierd.IOError would shadow OSError's alias).
        import builtins
        for name in dir(tierd):
            if isinstance(getattr(tierd, name), type) and issubclass(getattr(tierd, name), BaseException):
                self.assertFalse(hasattr(builtins, name), name)
        with self.assertRaises(ConnectionError):
            tierd.connect(os.path.join(daemon.dir, "nobody-here.sock"))

    def test_the_type_stubs_declare_every_public_name(self):
        import ast
        import tierd._native as native
        stub = os.path.join(os.path.dirname(tierd.__file__), "_native.pyi")
        tree = ast.parse(open(stub).read())
        declared, members = set(), {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                declared.add(node.name)
                members[node.name] = {n.name if isinstance(n, ast.FunctionDef) else n.target.id
                                      for n in node.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
            elif isinstance(node, ast.FunctionDef):
                declared.add(node.name)
            elif isinstance(node, ast.AnnAssign):
                declared.add(node.target.id)
        public = {n for n in dir(native) if not n.startswith("_")} | {"__version__"}
        self.assertEqual(public - declared, set())
        for cls in ("Client", "Lease", "PoolInfo", "TensorInfo"):
            names = {n for n in dir(getattr(native, cls)) if not n.startswith("_")}
            self.assertEqual(names - members[cls], set(), cls)
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(tierd.__file__), "py.typed")))

    def test_bad_arguments_are_python_errors(self):
        with tierd.connect(daemon.socket) as c:
            with self.assertRaises(ValueError):
                c.create_tensor("p", "t", shape=(4,), dtype="complex128")
            with self.assertRaises(ValueError):
                c.lease(1, "x")
            with self.assertRaises(TypeError):
                c.lease("not-a-tensor")


class PoolsAndTensors(unittest.TestCase):
    def setUp(self):
        self.c = tierd.connect(daemon.socket, name="test_binding")

    def tearDown(self):
        self.c.close()

    def test_pool_lifecycle(self):
        p = self.c.create_pool("py-pools", ram_quota=64 << 20)
        self.assertEqual(p.name, "py-pools")
        self.assertEqual(p.owner_uid, os.getuid())
        with self.assertRaises(tierd.AlreadyExists):
            self.c.create_pool("py-pools")
        again = self.c.create_pool("py-pools", exist_ok=True)
        self.assertEqual(again.id, p.id)
        self.assertIn("py-pools", [x.name for x in self.c.list_pools()])
        self.assertEqual(self.c.open_pool("py-pools").id, p.id)
        self.c.drop_pool("py-pools")
        with self.assertRaises(tierd.NotFound) as cm:
            self.c.open_pool("py-pools")
        self.assertEqual(cm.exception.code, "NotFound")

    def test_tensor_metadata(self):
        self.c.create_pool("py-tensors", exist_ok=True)
        t = self.c.create_tensor("py-tensors", "w", shape=(3, 5), dtype="float32")
        self.assertEqual(t.size, 60)
        self.assertEqual(t.dtype, "f32")
        self.assertEqual(t.shape, (3, 5))
        b = self.c.create_tensor("py-tensors", "raw", size=100)
        self.assertEqual((b.size, b.dtype, b.shape), (100, "bytes", ()))
        names = sorted(x.name for x in self.c.list_tensors("py-tensors"))
        self.assertEqual(names, ["raw", "w"])
        self.assertEqual(self.c.open_tensor("py-tensors", "w").id, t.id)
        self.c.delete_tensor("py-tensors", "raw")
        with self.assertRaises(tierd.NotFound):
            self.c.open_tensor("py-tensors", "raw")
        with self.assertRaises(ValueError):
            self.c.create_tensor("py-tensors", "nosize")
        self.c.drop_pool("py-tensors")

    def test_status_and_topology(self):
        s = self.c.status()
        self.assertGreaterEqual(s["clients"], 1)
        self.assertTrue(s["daemon_version"])
        self.assertGreater(sum(r["capacity"] for r in s["ram"]), 0)
        t = self.c.topology()
        self.assertGreaterEqual(len(t["nodes"]), 1)

    def test_closed_client_raises(self):
        c = tierd.connect(daemon.socket)
        c.close()
        self.assertTrue(c.closed)
        with self.assertRaises(tierd.Unavailable):
            c.list_pools()


@unittest.skipIf(np is None, "numpy is not installed (apt-get install python3-numpy)")
class Leases(unittest.TestCase):
    def setUp(self):
        self.c = tierd.connect(daemon.socket)
        self.c.create_pool("py-leases", exist_ok=True)
        self.t = self.c.create_tensor("py-leases", "x", shape=(1024,), dtype="f32", exist_ok=True)

    def tearDown(self):
        gc.collect()
        self.c.drop_pool("py-leases")
        self.c.close()

    def test_write_then_read_is_zero_copy(self):
        with self.c.lease(self.t, "w") as l:
            self.assertTrue(l.writable)
            self.assertEqual(l.nbytes, 4096)
            a = np.frombuffer(l, dtype=np.float32)
            self.assertEqual(a.ctypes.data, l.address)  # a view of the arena, not a copy
            a[:] = np.arange(1024, dtype=np.float32) * 0.5
            b = l.numpy()  # a second view of the same bytes
            self.assertEqual(b.dtype, np.float32)
            self.assertTrue(np.shares_memory(a, b))
            del a, b
        with self.c.lease(self.t, "r") as l:
            self.assertFalse(l.writable)
            r = np.frombuffer(l, dtype=np.float32)
            self.assertFalse(r.flags.writeable)
            np.testing.assert_array_equal(r, np.arange(1024, dtype=np.float32) * 0.5)
            with self.assertRaises(ValueError):
                r[0] = 1.0
            m = memoryview(l)
            self.assertTrue(m.readonly)
            with self.assertRaises(TypeError):
                m[0] = 1  # cannot modify read-only memory
            del r, m

    def test_release_refuses_while_views_live(self):
        l = self.c.lease(self.t, "w")
        v = np.frombuffer(l, dtype=np.float32)
        self.assertEqual(l.exports, 1)
        with self.assertRaises(BufferError):
            l.release()
        self.assertFalse(l.released)
        del v
        self.assertEqual(l.exports, 0)
        l.release()
        self.assertTrue(l.released)
        l.release()  # a second release is a no-op
        with self.assertRaises(BufferError):
            memoryview(l)

    def test_exit_with_live_view_raises(self):
        with self.assertRaises(BufferError):
            with self.c.lease(self.t, "w") as l:
                keep = np.frombuffer(l, dtype=np.float32)
        del keep
        l.release()
        self.assertTrue(l.released)

    def test_exception_with_live_view_keeps_lease_until_collected(self):
        other = tierd.connect(daemon.socket)
        with self.assertRaises(KeyError):  # not masked by a BufferError from __exit__
            with self.c.lease(self.t, "w") as l:
                keep = np.frombuffer(l, dtype=np.float32)
                raise KeyError("boom")
        self.assertFalse(l.released)
        with self.assertRaises(tierd.Busy):
            other.lease(self.t, "w")  # still held while a view is alive
        del keep, l
        gc.collect()
        with other.lease(self.t, "w"):  # the collected Lease released it
            pass
        other.close()

    def test_write_lease_is_exclusive(self):
        other = tierd.connect(daemon.socket)
        with self.c.lease(self.t, "w"):
            with self.assertRaises(tierd.Busy):
                other.lease(self.t, "w", timeout=0)
            with self.assertRaises(tierd.Error):
                other.lease(self.t, "r", timeout=0.05)
        with other.lease(self.t.id, "w") as l2:  # by id: free again once the first is released
            self.assertEqual(l2.tensor_id, self.t.id)
        other.close()

    def test_overwrite_lease_is_writable_and_exclusive(self):
        other = tierd.connect(daemon.socket)
        with self.c.lease(self.t, "o") as l:
            self.assertEqual(l.mode, "o")
            self.assertTrue(l.writable)
            np.frombuffer(l, dtype=np.float32)[:] = 7.0
            with self.assertRaises(tierd.Busy):
                other.lease(self.t, "r", timeout=0)
        with self.c.lease(self.t, "r") as l:
            np.testing.assert_array_equal(np.frombuffer(l, dtype=np.float32), np.full(1024, 7.0, np.float32))
        with self.assertRaises(ValueError):
            self.c.lease(self.t, "x")
        other.close()

    def test_lease_outlives_closed_client(self):
        c = tierd.connect(daemon.socket)
        l = c.lease(self.t, "w")
        c.close()
        a = np.frombuffer(l, dtype=np.float32)
        a[:] = 7.0  # the mapping is still there: the lease keeps the connection alive
        del a
        l.release()
        with self.c.lease(self.t, "r") as r:
            self.assertTrue(np.all(r.numpy() == 7.0))

    def test_batch_and_plan(self):
        t2 = self.c.create_tensor("py-leases", "y", shape=(16,), dtype="i64", exist_ok=True)
        ls = self.c.lease_batch([self.t, t2], "w")
        self.assertEqual([l.tensor_id for l in ls], [self.t.id, t2.id])
        ls[1].numpy()[:] = np.arange(16)
        for l in ls:
            l.release()
        # Plans and prefetch act on the NVMe tier; a daemon without one says so.
        for call in (lambda: self.c.set_plan("py-leases", [self.t, t2], budget=1 << 20),
                     lambda: self.c.prefetch("py-leases", [t2.id])):
            try:
                call()
            except tierd.Unsupported as e:
                self.assertIn("NVMe", e.message)
        with self.c.lease(t2) as l:
            np.testing.assert_array_equal(l.numpy(), np.arange(16))
            self.assertEqual(l.numpy().dtype, np.int64)
        # Discard is a hint: without an NVMe tier the RAM copy is the only one and stays.
        self.c.discard("py-leases", [t2])
        with self.c.lease(t2) as l:
            np.testing.assert_array_equal(l.numpy(), np.arange(16))
        with self.assertRaises(tierd.NotFound):
            self.c.discard("no-such-pool", [t2])


if __name__ == "__main__":
    unittest.main(verbosity=2)
