"""tools/bench/deepnvme_summary.py on figures whose ratios are known: the medians table, the
pair table (median, range, pairs at or above 1.0), the pooled geometric mean and its interval,
and the refusals (a malformed line, no tierd figures). Arithmetic only: no disk, no DeepSpeed."""
import json
import os
import subprocess
import sys
import tempfile

SUMMARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench",
                       "deepnvme_summary.py")
MiB = 1 << 20


def run(lines):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(lines))
    try:
        return subprocess.run([sys.executable, SUMMARY, f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


def fig(rnd, side, name, size, value, baseline=None, winner=None):
    j = {"round": rnd, "side": side, "first": rnd % 2 == 1, "name": name, "bytes": size, "value": value,
         "unit": "GB/s"}
    if baseline is not None:
        j.update(baseline=baseline, ratio=value / baseline, baseline_name=winner)
    return json.dumps(j) + "\n"


def row(out, first_cell):
    rows = [l for l in out.splitlines() if l.startswith("| %s |" % first_cell)]
    assert rows, "no row %r in:\n%s" % (first_cell, out)
    return [c.strip() for c in rows[-1].strip("|").split("|")]


def main():
    lines = []
    # 1 MiB: tierd spills 2.0, 3.0, 2.4 against DeepNVMe 2.0 each round: pair ratios 1.0, 1.5, 1.2.
    # 64 MiB: 1.8 against 2.0 in every round: 0.9.
    for rnd, spill in ((1, 2.0), (2, 3.0), (3, 2.4)):
        lines.append(fig(rnd, "tierd", "nvme.spill", MiB, spill, 2.5, "fio libaio qd32 bs1M"))
        lines.append(fig(rnd, "tierd", "nvme.spill.first", MiB, 2.0))
        lines.append(fig(rnd, "tierd", "nvme.fetch", MiB, 3.0, 2.0, "io_uring qd32 bs1M"))
        lines.append(fig(rnd, "deepnvme", "deepnvme.write", MiB, 2.0))
        lines.append(fig(rnd, "deepnvme", "deepnvme.write.first", MiB, 1.0))
        lines.append(fig(rnd, "deepnvme", "deepnvme.read", MiB, 2.0))
        lines.append(fig(rnd, "tierd", "nvme.spill", 64 * MiB, 1.8, 2.0, "io_uring qd64 bs1M"))
        lines.append(fig(rnd, "tierd", "nvme.spill.first", 64 * MiB, 1.8))
        lines.append(fig(rnd, "tierd", "nvme.fetch", 64 * MiB, 1.8, 2.0, "io_uring qd64 bs1M"))
        lines.append(fig(rnd, "deepnvme", "deepnvme.write", 64 * MiB, 2.0))
        lines.append(fig(rnd, "deepnvme", "deepnvme.write.first", 64 * MiB, 1.8))
        lines.append(fig(rnd, "deepnvme", "deepnvme.read", 64 * MiB, 2.0))
    lines.append(fig(3, "tierd", "nvme.prepare", 1 << 30, 1.5, 2.5, "x"))
    r = run(lines)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "medians of 3 rounds" in out, out

    pairs = row(out, "1 MiB")  # the pair table's row (row() takes the last match)
    first_table = [l for l in out.splitlines() if l.startswith("| 1 MiB |")][0]
    cells = [c.strip() for c in first_table.strip("|").split("|")]
    assert cells[1] == "2.40" and cells[3] == "2.00", cells  # median spill, median DeepNVMe write
    assert cells[5] == "**1.20**", cells                      # ratio of the medians
    assert cells[10] == "2.50 (fio libaio qd32 bs1M)", cells  # the raw ceiling and its winner

    assert pairs[1].startswith("1.20 [1.00-1.50], 3/3"), pairs  # spill pairs: 1.0, 1.5, 1.2
    assert pairs[2].startswith("1.00 [1.00-1.00], 3/3"), pairs  # fresh 2.0 vs rewrite 2.0
    assert pairs[3].startswith("1.50 [1.50-1.50], 3/3"), pairs
    big = row(out, "64 MiB")
    assert big[1].startswith("0.90 [0.90-0.90], 0/3"), big

    pooled = row(out, "all sizes")
    # Spill: geometric mean of 1.0, 1.5, 1.2, 0.9, 0.9, 0.9 = 1.046; six pairs.
    assert pooled[1].startswith("1.05 ["), pooled
    assert pooled[1].endswith("(6 pairs)"), pooled
    lo, hi = (float(x) for x in pooled[1].split("[")[1].split("]")[0].split("-"))
    assert 0.9 <= lo < 1.05 < hi <= 1.5, pooled
    # Fetch: 1.5 three times, 0.9 three times: sqrt(1.35) = 1.16.
    assert pooled[3].startswith("1.16 ["), pooled
    # Fresh tier against DeepNVMe's first write: 2.0 three times, 1.0 three times: sqrt(2).
    assert pooled[4].startswith("1.41 ["), pooled
    assert "preparation of a fresh tier's first data file: 1.50 GB/s" in out, out
    # Odd rounds went first: spills 2.0, 2.4 (1 MiB) and 1.8, 1.8 (64 MiB); second: 3.0 and 1.8.
    assert "nvme.spill 1.90 first, 2.40 second" in out, out
    assert "deepnvme.write 2.00 first, 2.00 second" in out, out
    # Pairs that followed a tierd side (tierd first: rounds 1 and 3): spill 1.0, 1.2, 0.9, 0.9;
    # those that followed a DeepNVMe side (round 2): 1.5 and 0.9.
    after_tierd, after_deepnvme = row(out, "a tierd side"), row(out, "a DeepNVMe side")
    assert after_tierd[1].startswith("0.99 [") and after_tierd[1].endswith("(4 pairs)"), after_tierd
    assert after_deepnvme[1].startswith("1.16 [") and after_deepnvme[1].endswith("(2 pairs)"), after_deepnvme

    assert "made durable" not in out, out

    # --durable: DeepNVMe's writes carry "synced"; the tables say so, and a run that mixes synced
    # and unsynced writes is refused (its ratios would compare unlike things).
    def synced(line):
        j = json.loads(line)
        if j["name"].startswith("deepnvme.write"):
            j["synced"] = True
        return json.dumps(j) + "\n"
    durable = run([synced(l) for l in lines])
    assert durable.returncode == 0, durable.stderr
    assert "DeepNVMe made durable (--durable)" in durable.stdout, durable.stdout
    assert row(durable.stdout, "all sizes")[1] == pooled[1], durable.stdout  # same figures, same ratios
    mixed = run([synced(l) if i < 6 else l for i, l in enumerate(lines)])
    assert mixed.returncode != 0 and "mixes DeepNVMe writes" in mixed.stderr + mixed.stdout, mixed

    bad = run(lines[:3] + ["{not json\n"])
    assert bad.returncode != 0 and "not a figure" in bad.stderr + bad.stdout, (bad.stdout, bad.stderr)
    none = run([fig(1, "deepnvme", "deepnvme.write", MiB, 2.0)])
    assert none.returncode == 1 and "no nvme.spill figure" in none.stderr, none.stderr
    print("deepnvme_summary: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
