"""What needs PyTorch 2 says so in one line on Debian's PyTorch 1.13 (label python), while
tierd.torch.OffloadAdamW keeps working there (test_offload_adamw.py covers it)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402

tu.import_tierd()
try:
    import torch
except ImportError as e:
    tu.skip(f"torch is not importable ({e}); apt-get install python3-torch")


class TorchVersionTest(unittest.TestCase):
    def test_checkpoint_module_on_old_torch(self):
        import tierd.torch  # noqa: F401  (works on any PyTorch)
        major_minor = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if major_minor >= (2, 4):
            import tierd.torch.checkpoint as ck
            self.assertTrue(hasattr(ck, "TierdWriter"))
            return
        with self.assertRaises(ImportError) as e:
            import tierd.torch.checkpoint  # noqa: F401
        msg = str(e.exception)
        self.assertEqual(len(msg.splitlines()), 1, msg)
        self.assertIn("needs PyTorch >= 2.4", msg)
        self.assertIn(torch.__version__, msg)


if __name__ == "__main__":
    unittest.main(verbosity=2)
