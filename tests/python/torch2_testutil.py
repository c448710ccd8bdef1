"""Launching the ranks of tests/python/fsdp2_worker.py for the torch2 suites."""
import atexit
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import tierd_testutil as tu

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fsdp2_worker.py")


def require_torch2():
    try:
        import torch
        import torch.distributed.fsdp  # noqa: F401
    except ImportError as e:
        tu.skip(f"PyTorch 2 is not importable ({e})")
    if not hasattr(torch.distributed.fsdp, "fully_shard"):
        tu.skip(f"PyTorch {torch.__version__} has no FSDP2 (fully_shard)")


class Job:
    """`world` ranks of fsdp2_worker.py in `mode`; each rank's result lines in results[rank]."""

    def __init__(self, world, mode, socket, pool, env=None, uid=None, **args):
        self.dir = tempfile.mkdtemp(prefix="tierd-torch2.")
        atexit.register(shutil.rmtree, self.dir, ignore_errors=True)  # the ranks' results and logs
        self.procs, self.outs = [], []
        for rank in range(world):
            out = os.path.join(self.dir, f"r{rank}.jsonl")
            a = dict(args, rank=rank, world=world, init=os.path.join(self.dir, "init"), socket=socket, pool=pool,
                     mode=mode, out=out)
            e = dict(os.environ, **(env or {}))
            pre = (lambda: os.setuid(uid)) if uid is not None else None
            with open(os.path.join(self.dir, f"r{rank}.log"), "wb") as log:
                self.procs.append(subprocess.Popen([sys.executable, WORKER, json.dumps(a)], env=e,
                                                   preexec_fn=pre, stdout=log, stderr=log, cwd=self.dir))
            self.outs.append(out)
        if uid is not None:
            os.chmod(self.dir, 0o777)

    def wait(self, timeout=240, kill_after=None):
        """Waits for every rank. kill_after=(step, seconds, ranks): SIGKILL those ranks `seconds`
        after rank 0 reported step `step`. Once any rank dies of SIGKILL the others (stuck in a
        collective) are killed too. Returns the exit codes."""
        deadline = time.monotonic() + timeout
        kill_at = None
        while any(p.poll() is None for p in self.procs):
            now = time.monotonic()
            if kill_after is not None and kill_at is None and len(self.value(0, "step")) >= kill_after[0]:
                kill_at = now + kill_after[1]
            if kill_at is not None and now >= kill_at:
                for r in kill_after[2]:
                    if self.procs[r].poll() is None:
                        self.procs[r].send_signal(signal.SIGKILL)
                kill_after = kill_at = None
            if any(p.poll() == -signal.SIGKILL for p in self.procs) or now > deadline:
                for p in self.procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.005)
        return [p.returncode for p in self.procs]

    def log(self, rank):
        with open(os.path.join(self.dir, f"r{rank}.log"), errors="replace") as f:
            return f.read()[-6000:]

    def results(self, rank):
        try:
            with open(self.outs[rank]) as f:
                return [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def value(self, rank, key):
        return [r[key] for r in self.results(rank) if key in r]

    def check(self, timeout=240):
        """Waits; raises AssertionError with the failing rank's output unless every rank exits 0."""
        codes = self.wait(timeout)
        for r, c in enumerate(codes):
            if c != 0:
                raise AssertionError(f"rank {r} exited with {c}:\n{self.log(r)}")
        return self


def random_kill_plans(seed, trials, steps, world, units):
    """(TIERD_TORCH_KILL_AT, TIERD_TORCH_KILL_RANK) inside step() for some trials, and a SIGKILL
    of some ranks after a random delay for the others."""
    rnd = random.Random(seed)
    plans = []
    for i in range(trials):
        if i % 2 == 0:
            where = rnd.choice([str(rnd.randrange(units)), "commit"])
            plans.append(dict(env={"TIERD_TORCH_KILL_AT": f"{rnd.randint(2, steps - 1)}:{where}",
                                   "TIERD_TORCH_KILL_RANK": str(rnd.randrange(world))}))
        else:
            ranks = rnd.choice([[0], [world - 1], list(range(world))])
            plans.append(dict(kill_after=(rnd.randint(1, steps - 2), rnd.uniform(0, 0.05), ranks)))
    return plans
