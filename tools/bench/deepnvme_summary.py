"""The tables of tools/bench-deepnvme, from the JSON lines its two sides printed.

Usage: python3 deepnvme_summary.py FIGURES.jsonl

Each input line is one figure of one side, tagged by the script with "round" and "side":
  tierd     tier-bench nvme: nvme.spill, nvme.spill.first, nvme.fetch (with the raw ceiling as
            "baseline" and the winning candidate as "baseline_name"), nvme.prepare
  deepnvme  tools/bench/deepnvme_side.py: deepnvme.write.first, deepnvme.write, deepnvme.read
            (the writes with "synced": true when every file was fdatasync'd, --durable; a run
            may not mix synced and unsynced writes)

Four tables and a line on stdout:
  1. medians over the rounds of each figure, and the ratios of those medians;
  2. the ratio of each pair (the two sides of one size in one round, run back to back), as the
     median of the pairs, their range, and how many pairs were at or above 1.0;
  3. every size's pairs pooled: their geometric mean ratio and its 95% bootstrap interval (the
     disk's noise spreads single pairs by a third; an interval above 1.0 says tierd is faster
     beyond that noise);
  4. with lines tagged "first": the pairs pooled by the kind of side both sides followed, and
     each side's median figures when it went first and when second (a large difference means
     one side's leftovers slowed the next).
A ratio is tierd / DeepNVMe: spill against DeepNVMe's rewrite (its steady state), the fresh
tier's first spill against the same rewrite, fetch against DeepNVMe's read.
"""
import json
import math
import random
import statistics
import sys
from collections import Counter, defaultdict

# (label, tierd figure, DeepNVMe figure)
RATIOS = (("spill", "nvme.spill", "deepnvme.write"),
          ("fresh", "nvme.spill.first", "deepnvme.write"),
          ("fetch", "nvme.fetch", "deepnvme.read"))


def size_text(b):
    return "%d GiB" % (b >> 30) if b >= 1 << 30 else "%d MiB" % (b >> 20)


def load(path):
    """{(name, bytes): {round: value}}, {(name, bytes): [ceiling]}, {(name, bytes): Counter},
    {(name, went first in its pair): [value]}, {(bytes, round): tierd's side went first}."""
    vals = defaultdict(dict)
    ceiling = defaultdict(list)
    won = defaultdict(Counter)
    order = defaultdict(list)  # (name, went first) -> values
    tierd_first = {}  # (bytes, round) -> whether tierd's side went first in that pair
    synced = set()  # whether DeepNVMe's writes were fdatasync'd, over every write line
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                j = json.loads(line)
                key = (j["name"], int(j["bytes"]))
                vals[key][int(j.get("round", 0))] = float(j["value"])
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit("deepnvme_summary: %s:%d: not a figure (%s)" % (path, n, e))
            if j["name"].startswith("deepnvme.write"):
                synced.add(bool(j.get("synced", False)))
            if "first" in j:
                order[(j["name"], bool(j["first"]))].append(float(j["value"]))
                if j["name"] == "nvme.spill":
                    tierd_first[key[1], int(j.get("round", 0))] = bool(j["first"])
            if j["name"] in ("nvme.spill", "nvme.fetch") and j.get("baseline_name"):
                ceiling[key].append(float(j["baseline"]))
                won[key][j["baseline_name"]] += 1
    if len(synced) > 1:
        raise SystemExit("deepnvme_summary: %s mixes DeepNVMe writes with and without fdatasync" % path)
    return vals, ceiling, won, order, tierd_first, synced == {True}


def median(v):
    return statistics.median(v) if v else math.nan


def pair_ratios(vals, mine, theirs, size, keep=lambda r: True):
    """Ratios of the rounds in which both sides measured `size` (and keep(round)), in round order."""
    a, b = vals.get((mine, size), {}), vals.get((theirs, size), {})
    return [a[r] / b[r] for r in sorted(a.keys() & b.keys()) if b[r] > 0 and keep(r)]


BOOTSTRAP = 10000


def pooled(ratios):
    """'g [lo-hi] (n pairs)': the geometric mean of the ratios and its 95% percentile bootstrap
    interval (fixed seed, so the same figures print the same text)."""
    if not ratios:
        return "-"
    logs = [math.log(x) for x in ratios if x > 0]
    rng = random.Random(1)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(BOOTSTRAP))
    lo, hi = means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]
    return "%.2f [%.2f-%.2f] (%d pairs)" % (math.exp(statistics.fmean(logs)), math.exp(lo), math.exp(hi), len(logs))


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    vals, ceiling, won, order, tierd_first, durable = load(argv[1])
    sizes = sorted({b for (n, b) in vals if n == "nvme.spill"})
    if not sizes:
        print("deepnvme_summary: no nvme.spill figure in %s" % argv[1], file=sys.stderr)
        return 1
    rounds = max(len(v) for v in vals.values())

    def med(name, b):
        return median(list(vals.get((name, b), {}).values()))

    print("GB/s, medians of %d rounds; ratio = tierd / DeepNVMe (>= 1.0: tierd at least as fast)" % rounds)
    if durable:
        print("DeepNVMe made durable (--durable): every file fdatasync'd after its writes, inside the timing")
    print()
    print("| size | tierd spill | tierd spill, fresh tier | DeepNVMe write | DeepNVMe first write | spill ratio "
          "| fresh ratio | tierd fetch | DeepNVMe read | fetch ratio | raw write (winner) | raw read (winner) |")
    print("| --- " * 12 + "|")
    for b in sizes:
        s, sf = med("nvme.spill", b), med("nvme.spill.first", b)
        w, wf = med("deepnvme.write", b), med("deepnvme.write.first", b)
        f, r = med("nvme.fetch", b), med("deepnvme.read", b)
        rw, rr = median(ceiling[("nvme.spill", b)]), median(ceiling[("nvme.fetch", b)])
        ww = won[("nvme.spill", b)].most_common(1)[0][0] if won[("nvme.spill", b)] else "-"
        wr = won[("nvme.fetch", b)].most_common(1)[0][0] if won[("nvme.fetch", b)] else "-"
        print("| %s | %.2f | %.2f | %.2f | %.2f | **%.2f** | **%.2f** | %.2f | %.2f | **%.2f** | %.2f (%s) | %.2f (%s) |" %
              (size_text(b), s, sf, w, wf, s / w, sf / w, f, r, f / r, rw, ww, rr, wr))
    print()
    print("Pairs (one size, one round, the two sides back to back): median ratio [lowest-highest], "
          "pairs at or above 1.0")
    print()
    print("| size | " + " | ".join("%s ratio" % label for label, _, _ in RATIOS) + " |")
    print("| --- " * (1 + len(RATIOS)) + "|")
    for b in sizes:
        cells = []
        for _, mine, theirs in RATIOS:
            p = pair_ratios(vals, mine, theirs, b)
            cells.append("%.2f [%.2f-%.2f], %d/%d" % (median(p), min(p), max(p), sum(x >= 1.0 for x in p), len(p))
                         if p else "-")
        print("| %s | %s |" % (size_text(b), " | ".join(cells)))
    print()
    print("All sizes pooled: geometric mean of the pair ratios, 95%% bootstrap interval (%d resamples)" % BOOTSTRAP)
    print()
    print("| | " + " | ".join("%s ratio" % label for label, _, _ in RATIOS) + " | fresh / DeepNVMe first write |")
    print("| --- " * (2 + len(RATIOS)) + "|")
    cells = [pooled([x for b in sizes for x in pair_ratios(vals, mine, theirs, b)]) for _, mine, theirs in RATIOS]
    cells.append(pooled([x for b in sizes for x in pair_ratios(vals, "nvme.spill.first", "deepnvme.write.first", b)]))
    print("| all sizes | " + " | ".join(cells) + " |")
    if tierd_first:
        # The script alternates the order from pair to pair, so both sides of a pair follow the
        # side that ended the previous pair: tierd's when tierd went first, DeepNVMe's otherwise.
        print()
        print("By the kind of side both sides of a pair followed (pooled over sizes):")
        print()
        print("| pairs that followed | " + " | ".join("%s ratio" % label for label, _, _ in RATIOS) + " |")
        print("| --- " * (1 + len(RATIOS)) + "|")
        for label, first in (("a tierd side", True), ("a DeepNVMe side", False)):
            cells = [pooled([x for b in sizes for x in pair_ratios(
                vals, mine, theirs, b, lambda r, b=b: tierd_first.get((b, r)) is first)])
                for _, mine, theirs in RATIOS]
            print("| %s | %s |" % (label, " | ".join(cells)))
    if order:
        # Whether a side ran faster when it went first in its pair or second, right after the
        # other side: a large difference means one side's leftovers slowed the other's figures.
        print()
        print("Order (all sizes, GB/s, median): " + "; ".join(
            "%s %.2f first, %.2f second" % (name, median(order[(name, True)]), median(order[(name, False)]))
            for name in ("nvme.spill", "deepnvme.write", "nvme.fetch", "deepnvme.read")
            if order[(name, True)] and order[(name, False)]))
    prep = [x for (n, b), v in vals.items() if n == "nvme.prepare" for x in v.values()]
    if prep:
        print()
        print("start-up preparation of a fresh tier's first data file: %.2f GB/s (median)" % median(prep))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
