"""The two parsers of checkpoint bytes the Python package reads back from a pool, fed damaged
and crafted input: tierd.torch's DCP commit record (tierd.torch._store.decode_record) and
tierd.deepspeed's checkpoint header (tierd._ds_checkpoint.payload_length).

Both must answer every input with a value or "not a checkpoint" (None), never an exception:
a damaged record is as if the save never committed, and a damaged header is a SwapError that
names the file. Mutations are drawn from a fixed seed (TIERD_FUZZ_SEED), TIERD_FUZZ_ITERS per
parser (default 3000; tools/fuzz-style long runs set more). A record damaged anywhere fails its
digest; one crafted with a valid digest but the wrong types is refused by its type check.
"""
import hashlib
import os
import pickle
import random
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tierd_testutil as tu  # noqa: E402

tu.import_tierd()
try:
    import torch  # noqa: F401
except ImportError as e:
    tu.skip(f"torch is not importable ({e})")
from tierd import _ds_checkpoint as ds  # noqa: E402
from tierd.torch import _store  # noqa: E402

SEED = int(os.environ.get("TIERD_FUZZ_SEED", "20261207"))
ITERS = int(os.environ.get("TIERD_FUZZ_ITERS", "3000"))


def metadata(storage):
    try:
        from torch.distributed.checkpoint.metadata import Metadata
        return Metadata(state_dict_metadata={}, storage_data=storage)
    except ImportError:  # a PyTorch without DCP: any object with storage_data is read alike
        return types.SimpleNamespace(storage_data=storage)


def payload(**over):
    stored = _store.Stored("dcp|00ff|data.r0", 0, 64, "float32", (4, 4), (123,))
    base = dict(checkpoint_id="step-7", save_id="00112233aabbccdd", time_ns=1_700_000_000_000_000_000, world=2,
                nbytes=64, metadata=metadata({"w": stored}))
    return base | over


def signed(obj) -> bytes:
    """A record with a valid header and digest around pickle(obj): what only a writer that
    means to can make."""
    body = pickle.dumps(obj)
    return _store._HEADER.pack(_store.MAGIC, len(body), hashlib.blake2b(body, digest_size=32).digest()) + body


def mutate(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        if kind == 0 and b:  # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and b:  # set a byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 2:  # truncate
            del b[rng.randrange(len(b) + 1):]
        elif kind == 3:  # append
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
        elif kind == 4 and len(b) >= 16:  # rewrite the length field (record: bytes 8..16)
            b[8:16] = rng.choice([0, 1, len(b), 2 ** 63, 2 ** 64 - 1, rng.randrange(2 ** 64)]).to_bytes(8, "little")
        elif kind == 5 and b:  # zero a run (a torn write)
            i = rng.randrange(len(b))
            b[i:i + rng.randint(1, 64)] = bytes(len(b[i:i + 64]))
    return bytes(b)


class CommitRecord(unittest.TestCase):
    def test_a_valid_record_round_trips(self):
        p = payload()
        self.assertEqual(_store.decode_record(_store.encode_record(p)), p)

    def test_damage_anywhere_reads_as_no_record(self):
        rng = random.Random(SEED)
        raw = _store.encode_record(payload())
        same = 0
        for _ in range(ITERS):
            bad = mutate(rng, raw)
            got = _store.decode_record(bad)  # never raises
            if bad[:len(raw)] == raw and got is not None:
                same += 1  # only bytes appended past the record: it is still the record
                self.assertEqual(got, payload())
            else:
                self.assertIsNone(got, bad[:40])
        self.assertLess(same, ITERS)  # the mutations really damaged records

    def test_crafted_payloads_of_the_wrong_shape_are_refused(self):
        for obj in (None, 7, [1, 2], "x", {}, payload(save_id=5), payload(world="2"),
                    payload(time_ns=None), payload(metadata=None), payload(metadata=metadata({"w": "str"})),
                    payload(metadata=metadata([]))):
            self.assertIsNone(_store.decode_record(signed(obj)), repr(obj)[:80])

    def test_random_bytes_are_no_record(self):
        rng = random.Random(SEED + 1)
        for _ in range(ITERS):
            raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, 96)))
            if rng.random() < 0.5:
                raw = _store.MAGIC + raw
            self.assertIsNone(_store.decode_record(raw))


class DeepSpeedHeader(unittest.TestCase):
    def header(self, n):
        return ds._MAGIC + n.to_bytes(8, "little")

    def test_valid_headers(self):
        self.assertEqual(ds.payload_length(self.header(0), ds._HEADER), 0)
        self.assertEqual(ds.payload_length(self.header(100), ds._HEADER + 100), 100)
        self.assertEqual(ds.payload_length(self.header(100), ds._HEADER + 4096), 100)  # a tensor with room left

    def test_damaged_headers_never_announce_more_than_the_tensor_holds(self):
        rng = random.Random(SEED + 2)
        accepted = 0
        for _ in range(ITERS):
            total = rng.choice([0, 1, 8, 15, 16, 17, 4096, rng.randrange(1 << 40)])
            n = rng.randrange(total + 1)
            head = mutate(rng, self.header(n))[:ds._HEADER]
            got = ds.payload_length(head, total)
            if got is not None:
                accepted += 1
                self.assertEqual(head[:8], ds._MAGIC)
                self.assertLessEqual(ds._HEADER + got, total)
                self.assertEqual(got, int.from_bytes(head[8:16], "little"))
            elif len(head) == ds._HEADER and head[:8] == ds._MAGIC:
                self.assertGreater(ds._HEADER + int.from_bytes(head[8:16], "little"), total)
        self.assertGreater(accepted, 0)  # some mutations kept a valid header: both branches ran

    def test_short_or_foreign_input(self):
        for head, total in ((b"", 0), (ds._MAGIC, 8), (self.header(0)[:15], 15), (b"TIERDCP1" + bytes(8), 16),
                            (self.header(1), 16)):
            self.assertIsNone(ds.payload_length(head, total), (head, total))


if __name__ == "__main__":
    unittest.main(verbosity=1)
