"""tier-train on several nodes made of Linux namespaces (tools/nodes), launched by Open MPI the
way a cluster launches it: hostfile, rsh agent, TCP between nodes, one tierd per node at the
default socket. Each case is a ctest test (tests/multinode/CMakeLists.txt, label multinode):

  same_losses    2 nodes x 2 ranks train `small` (state in each node's tierd) exactly like 4
                 ranks on one host, and like one process within the rank-count tolerance
                 of tests/trainer/zero3_test.cpp; each node's tierd holds its own ranks' shards
                 and its own commit marker (MPI's shared-memory split sees one node per namespace)
  kill_ranks     kill -9 of one node's ranks at a random instant, then --resume: every loss of
                 both runs is the uninterrupted run's
  kill_tierd     kill -9 of one node's tierd mid-run: restarted at once, its ranks reconnect and
                 the job finishes with the uninterrupted losses; left down, the job fails, and
                 --resume after a restart continues with them
  reshard        4 ranks commit half the job; --resume --reshard on 2 ranks (one per node)
                 re-slices the state from both tierds: its first step reads exactly the
                 parameters of the uninterrupted 4-rank run, and the losses follow it
  reboot         with --snapshot-every 4 and part of the state on NVMe, one node reboots
                 mid-run: --resume rolls both nodes back to the newest cut both hold and the
                 losses from there on are the uninterrupted run's

Run as `python3 multinode_test.py CASE`: it checks it can (root, unshare, nsenter, ip, mpirun,
namespaces; exit 77 = skipped otherwise) and runs itself again under `tools/nodes run`, which
tears the nodes down however the case ends. Environment: TIER_BIN_DIR (build/bin)."""
import json
import os
import random
import shutil
import subprocess
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NODES = os.path.join(REPO, "tools", "nodes")
BIN = os.environ.get("TIER_BIN_DIR") or os.path.join(REPO, "build", "bin")
TRAIN = os.path.join(BIN, "tier-train")
# Leak checking off in ranks (see tests/trainer/run_helper.hpp: Open MPI's plugins under ASan).
RANK_ENV = ["-x", "OMP_NUM_THREADS=1", "-x", "LSAN_OPTIONS=detect_leaks=0"]
BASE = "--model small --batch 8 --lr 3e-3 --val-every -1 --threads 1"


def skip(reason):
    print(f"SKIPPED: {reason}", flush=True)
    sys.exit(SKIP)


def fail(msg):
    print(f"FAILED: {msg}", flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def can_run():
    if os.geteuid() != 0:
        skip("needs root: tools/nodes makes network, mount and IPC namespaces and a bridge")
    for tool in ("unshare", "nsenter", "ip", "mpirun"):
        if shutil.which(tool) is None:
            skip(f"{tool} is not installed (tools/install-deps)")
    for b in ("tierd", "tierctl", "tier-train"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            skip(f"{os.path.join(BIN, b)} is not built")
    probe = subprocess.run(["unshare", "--net", "--ipc", "--mount", "--uts", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        skip(f"cannot make namespaces here: {probe.stderr.strip()}")


class Run:
    def __init__(self, rc, steps, losses, err):
        self.rc, self.steps, self.losses, self.err = rc, steps, losses, err

    def table(self):
        return dict(zip(self.steps, self.losses))


def parse(out):
    steps, losses = [], []
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in j:
            steps.append(j["step"])
            losses.append(j["loss"])
    return steps, losses


def train_cmd(ranks, args, where="nodes", ranks_per_node=None):
    """tier-train ARGS on `ranks` ranks: across the nodes (tools/nodes mpirun), on this host
    (plain mpirun, one shared-memory node) or as one process (ranks == 1, where == "host")."""
    tail = [TRAIN] + (BASE + " " + args).split()
    if where == "nodes":
        spread = ["--map-by", f"ppr:{ranks_per_node}:node"] if ranks_per_node else []
        return [NODES, "mpirun", "-np", str(ranks)] + spread + RANK_ENV + tail
    if ranks == 1:
        return tail
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + RANK_ENV + tail


def train(ranks, args, where="nodes", timeout=240, ranks_per_node=None):
    p = subprocess.run(train_cmd(ranks, args, where, ranks_per_node), capture_output=True, text=True,
                       timeout=timeout)
    steps, losses = parse(p.stdout)
    return Run(p.returncode, steps, losses, p.stderr)


def train_interrupted(ranks, args, at_step, action, timeout=240):
    """Runs the job; once it printed step `at_step`, calls action() (a fault) and reads on
    until the job ends."""
    p = subprocess.Popen(train_cmd(ranks, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    out, fired = [], False
    deadline = time.monotonic() + timeout
    for line in p.stdout:
        out.append(line)
        if not fired and parse(line)[0] and parse(line)[0][0] >= at_step:
            action()
            fired = True
        check(time.monotonic() < deadline, "the interrupted job ran past its time")
    err = p.stderr.read()
    rc = p.wait()
    steps, losses = parse("".join(out))
    check(fired, f"the job never reached step {at_step}: rc {rc}\n{err}")
    return Run(rc, steps, losses, err)


def nodes(*args, capture=False):
    p = subprocess.run([NODES] + list(args), capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"tools/nodes {' '.join(args)}: {p.stderr}")
    return p.stdout


def node_procs(node, program):
    """Pids of the processes of `node` running `program`, found as `tools/nodes pids` finds
    them but without a fork per process: the ranks busy-poll both cores, and a shell loop over
    /proc can take longer than the rest of the job."""
    d = os.path.join(os.environ["TIER_NODES_DIR"], node)
    with open(os.path.join(d, "netns")) as f:
        ns = f.read().strip()
    with open(os.path.join(d, "holder")) as f:
        holder = f.read().strip()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == holder:
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == ns and \
               os.path.basename(os.readlink(f"/proc/{pid}/exe")) == program:
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def kill_in_node(node, program):
    """SIGKILL them; returns how many there were."""
    pids = node_procs(node, program)
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return len(pids)


def require_ok(r, what):
    check(r.rc == 0, f"{what} failed (rc {r.rc}):\n{r.err}")


def same_as(want, r, what):
    """Every loss r printed is exactly the uninterrupted run's at that step."""
    for s, loss in zip(r.steps, r.losses):
        check(s in want, f"{what}: step {s} is not in the reference run")
        check(loss == want[s], f"{what}: step {s} loss {loss!r}, uninterrupted {want[s]!r}")


def pool_tensors(node, pool):
    out = nodes("exec", node, os.path.join(BIN, "tierctl"), "tensors", pool)
    return [line.split()[0] for line in out.splitlines()[1:] if line.strip()]


# ---- the cases (inside the nodes) ----

def case_same_losses():
    steps = 8
    args = f"--steps {steps} --seed 7"
    one = train(1, args, where="host")
    require_ok(one, "one process")
    check(len(one.losses) == steps, f"one process printed {len(one.steps)} steps")
    check(one.losses[-1] < one.losses[0] - 0.5, "it does not train")
    host4 = train(4, args, where="host")
    require_ok(host4, "4 ranks on this host")
    multi = train(4, args + " --state tier --job same")
    require_ok(multi, "2 nodes x 2 ranks")
    check(multi.steps == one.steps, f"steps {multi.steps}")
    for s, a, b, c in zip(multi.steps, multi.losses, host4.losses, one.losses):
        # Bit-identical to the same rank count on one host; within zero3_test's tolerance of
        # one process (a 4-way sum adds in another order).
        check(a == b, f"step {s}: 2 nodes x 2 ranks {a!r}, 4 ranks on one host {b!r}")
        check(abs(a - c) <= 1e-5 * abs(c), f"step {s}: 2 nodes x 2 ranks {a!r}, one process {c!r}")
    # Each node's tierd holds its own ranks' state and its own marker: node-local ranks
    # (MPI_COMM_TYPE_SHARED) are the ranks of that namespace.
    for node, ranks in (("node1", {"r0", "r1"}), ("node2", {"r2", "r3"})):
        names = pool_tensors(node, "same")
        check("commit" in names, f"{node} has no commit marker: {names}")
        owners = {n.split(".")[0] for n in names if n != "commit"}
        check(owners == ranks, f"{node} holds the shards of {sorted(owners)}, want {sorted(ranks)}")
    print(f"same_losses: {steps} steps equal across {len(multi.steps)} lines", flush=True)


def reference(args, job):
    ref = train(4, args + f" --job {job}")
    require_ok(ref, "the uninterrupted run")
    return ref.table()


def case_kill_ranks():
    steps = 24
    args = f"--steps {steps} --seed 5 --state tier"
    want = reference(args, "ref")
    check(len(want) == steps, f"the reference printed {len(want)} steps")
    rng = random.Random()
    for rnd, at in enumerate((3, 11)):
        job = f" --job crash{rnd}"
        delay = rng.uniform(0, 0.15)

        def kill_node2():
            time.sleep(delay)
            check(kill_in_node("node2", "tier-train") == 2, "node2 does not run 2 ranks")

        a = train_interrupted(4, args + job, at, kill_node2)
        check(a.rc != 0, f"round {rnd}: the job outlived its node's ranks")
        b = train(4, args + job + " --resume")
        require_ok(b, f"round {rnd}: --resume")
        check(b.steps and b.steps[-1] == steps, f"round {rnd}: resumed steps {b.steps}")
        # From the step after the last commit every node's marker has: past `at` (printed, so
        # committed), at most one past the last step the killed run printed.
        check(a.steps and at <= b.steps[0] <= a.steps[-1] + 2,
              f"round {rnd}: resumed at {b.steps[0]} after the killed run printed {a.steps}, rc {a.rc}:\n{a.err}")
        same_as(want, a, f"round {rnd}, killed run")
        same_as(want, b, f"round {rnd}, resumed run")
        print(f"kill_ranks: killed after step {at} (+{delay * 1e3:.0f} ms), resumed at {b.steps[0]}", flush=True)


def case_kill_tierd():
    steps = 14
    args = f"--steps {steps} --seed 9 --state tier"
    want = reference(args, "ref")
    # Restarted at once: the ranks' clients reconnect (libtier re-acquires their leases), the
    # job never stops.
    def crash_and_restart():
        check(kill_in_node("node2", "tierd") == 1, "node2 runs no tierd")
        # The crash came while the job ran: node2's ranks are still there to reconnect.
        check(len(node_procs("node2", "tier-train")) == 2, "the job ended before its tierd crashed")
        nodes("tierd", "node2", "start")

    a = train_interrupted(4, args + " --job back", 4, crash_and_restart)
    require_ok(a, "the job whose tierd restarted")
    check(a.steps == sorted(want), f"steps {a.steps}")
    same_as(want, a, "the job whose tierd restarted")
    # Left down past the clients' reconnect time: the job fails; with tierd back (its arenas in
    # the node's /dev/shm, its catalog from the state dir) --resume continues.
    b = train_interrupted(4, args + " --job down", 4, lambda: kill_in_node("node2", "tierd"))
    check(b.rc != 0, "the job outlived its node's tierd")
    nodes("tierd", "node2", "start")
    c = train(4, args + " --job down --resume")
    require_ok(c, "--resume after tierd came back")
    check(c.steps and c.steps[-1] == steps and c.steps[0] <= b.steps[-1] + 1, f"resumed steps {c.steps} after {b.steps}")
    same_as(want, b, "the job that lost its tierd")
    same_as(want, c, "the resumed job")
    print(f"kill_tierd: reconnected over a restart; failed after step {b.steps[-1]} and resumed at {c.steps[0]}", flush=True)


def case_reshard():
    # 4 ranks on 2 nodes commit 6 of 12 steps (rank 0 is killed in step 7); the job goes on with
    # 2 ranks, one per node: --resume --reshard re-slices params, m and v from both tierds.
    steps = 12
    args = f"--steps {steps} --seed 5 --state tier"
    out = os.path.join(os.environ["TIER_NODES_DIR"], "dump")
    os.makedirs(f"{out}/ref")
    os.makedirs(f"{out}/rs")
    ref = train(4, args + f" --job ref --dump {out}/ref --dump-steps 7")
    require_ok(ref, "the uninterrupted 4-rank run")
    a = train(4, args + " --job rs --fault-kill 7:forward:0")
    check(a.rc != 0 and a.steps == list(range(1, 7)), f"the 4-rank run printed {a.steps}, rc {a.rc}")
    plain = train(2, args + " --job rs --resume", ranks_per_node=1)
    check(plain.rc != 0, "--resume without --reshard took another rank count's state")
    b = train(2, args + f" --job rs --resume --reshard --dump {out}/rs --dump-steps 1", ranks_per_node=1)
    require_ok(b, "--resume --reshard on 2 ranks")
    check(b.steps == list(range(7, steps + 1)), f"resharded steps {b.steps}")
    # A copy: step 7 reads exactly the parameters the uninterrupted run read.
    with open(f"{out}/ref/params.7.bin", "rb") as f1, open(f"{out}/rs/params.7.bin", "rb") as f2:
        check(f1.read() == f2.read(), "step 7's parameters differ from the uninterrupted run's")
    # From there the 2-rank sums add in another order than 4 ranks': zero3_test's tolerance.
    want = ref.table()
    for s, loss in zip(b.steps, b.losses):
        check(abs(loss - want[s]) <= 1e-5 * abs(want[s]), f"step {s}: resharded {loss!r}, 4 ranks {want[s]!r}")
    # Each node's tierd holds only its new rank's shards (the old ones dropped) and a marker.
    for node, owner in (("node1", "r0"), ("node2", "r1")):
        owners = {n.split(".")[0] for n in pool_tensors(node, "rs") if n != "commit"}
        check(owners == {owner}, f"{node} holds the shards of {sorted(owners)} after the reshard")
    # And the job resumes on 2 ranks as usual from here.
    c = train(2, args.replace(f"--steps {steps}", f"--steps {steps + 2}") + " --job rs --resume", ranks_per_node=1)
    require_ok(c, "a plain --resume after the reshard")
    check(c.steps == [steps + 1, steps + 2], f"steps {c.steps}")
    print(f"reshard: 4 -> 2 ranks at step 7, steps 7..{steps} within 1e-5 of the 4-rank run", flush=True)


def snapshots(node, pool):
    return json.loads(nodes("exec", node, os.path.join(BIN, "tierctl"), "--json", "snapshots", pool))


def case_reboot():
    # --snapshot-every 4 cuts every node's pool at steps 4, 8, ...; the RAM quota is below the
    # job's state, so part of it lives on each node's NVMe. node2 reboots mid-run (its /dev/shm
    # and tierd gone, its state and NVMe dirs kept): its tierd rebuilds the pool from its latest
    # snapshot plus the newer NVMe copies, a mix of steps. --resume rolls both nodes back to the
    # newest cut both hold, and every loss from there on is the uninterrupted run's.
    steps = 16
    args = f"--steps {steps} --seed 11 --state tier --snapshot-every 4 --ram-quota 8M"
    want = reference(args, "ref")
    check(len(want) == steps, f"the reference printed {len(want)} steps")
    ref_snaps = snapshots("node1", "ref")
    check([e["tag"] for e in ref_snaps["snapshots"]] == [12, 16], f"kept cuts {ref_snaps}")
    delay = random.Random().uniform(0, 0.3)

    def reboot_node2():
        time.sleep(delay)
        nodes("reboot", "node2")

    a = train_interrupted(4, args + " --job boot", 9, reboot_node2)
    check(a.rc != 0, "the job outlived its rebooted node")
    after = snapshots("node2", "boot")
    check(after["recovered"], f"node2's pool does not say it was rebuilt: {after}")
    b = train(4, args + " --job boot --resume")
    require_ok(b, "--resume after the reboot")
    cut = None
    for line in b.err.splitlines():
        if "rolled back to the snapshot of step" in line:
            cut = int(line.rsplit(" ", 1)[1])
    check(cut is not None, f"--resume did not roll back:\n{b.err}")
    # Step 8's cut was durable on both nodes before step 9 printed; a later one at most just
    # before the reboot.
    check(cut % 4 == 0 and 8 <= cut <= a.steps[-1] + 1, f"rolled back to {cut} after the run printed {a.steps}")
    check(b.steps == list(range(cut + 1, steps + 1)), f"resumed steps {b.steps} after a cut at {cut}")
    same_as(want, a, "the run whose node rebooted")
    same_as(want, b, "the resumed run")
    for node in ("node1", "node2"):
        check(not snapshots(node, "boot")["recovered"], f"{node}'s pool still says recovered")
    print(f"reboot: node2 rebooted after step {a.steps[-1]} (+{delay * 1e3:.0f} ms); both nodes rolled back to "
          f"the cut of step {cut}; steps {cut + 1}..{steps} equal the uninterrupted run", flush=True)


# name: (nodes, case, environment of tools/nodes)
CASES = {"same_losses": (2, case_same_losses, {}), "kill_ranks": (2, case_kill_ranks, {}),
         "kill_tierd": (2, case_kill_tierd, {}), "reshard": (2, case_reshard, {}),
         "reboot": (2, case_reboot, {"TIER_NODES_NVME": "1"})}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        print(f"usage: {sys.argv[0]} {'|'.join(CASES)}", file=sys.stderr)
        return 2
    n, case, case_env = CASES[sys.argv[1]]
    if "TIER_NODES_DIR" not in os.environ:
        can_run()
        env = dict(os.environ, TIER_BIN_DIR=BIN, **case_env)
        env.pop("TIERD_SOCKET", None)
        t0 = time.monotonic()
        # SIGTERM on overrun: tools/nodes stops the case and tears the nodes down.
        p = subprocess.Popen([NODES, "run", str(n), sys.executable, os.path.abspath(__file__), sys.argv[1]], env=env)
        try:
            rc = p.wait(timeout=270)
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait(timeout=25)
            rc = 1
            print("FAILED: the case ran past 270 s", flush=True)
        print(f"{sys.argv[1]}: {time.monotonic() - t0:.1f} s with {n} nodes, exit {rc}", flush=True)
        return rc
    case()
    return 0


if __name__ == "__main__":
    sys.exit(main())
