#!/usr/bin/env python3
"""Medians, paired ratios and their 95 % intervals from lab/bench's raw BENCH lines."""
import json, random, statistics, sys
raw, rounds = sys.argv[1], int(sys.argv[2])
def bootstrap_ci(xs, n=4000):
    """95 % percentile interval of the median of xs, by resampling (fixed seed: reproducible)."""
    rng = random.Random(7)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]

runs = [json.loads(l.split(" ", 1)[1]) for l in open(raw) if l.startswith("BENCH ")]
cases = []
for name in dict.fromkeys(r["case"] for r in runs):
    vals = {t: [r["value"] for r in runs if r["case"] == name and r["tool"] == t] for t in ("rdmabench", "perftest")}
    lat = "-lat" in name
    med = {t: statistics.median(v) for t, v in vals.items()}
    ratio = med["rdmabench"] / med["perftest"]
    # Each round's two runs share the guest's state of the moment (its runs drift between
    # modes under TCG), so the median of the per-round ratios is the robust comparison.
    pairs = [a / b for a, b in zip(vals["rdmabench"], vals["perftest"])]
    paired = statistics.median(pairs)
    lo, hi = bootstrap_ci(pairs)
    goal = 1.10 if "adaptive" in name else 1.00
    target = f"<= {goal:.2f}" if lat else f">= {goal:.2f}"
    met = paired <= goal if lat else paired >= goal
    # Not met but the 95 % interval holds the goal: the runs cannot tell the two apart.
    worse = lo > goal if lat else hi < goal
    verdict = "met" if met else ("NOT met" if worse else "within noise")
    spread = {t: {"min": min(v), "max": max(v)} for t, v in vals.items()}
    cases.append({
        "case": name,
        "spread": spread,
        "metric": ("p50 latency [usec] (perftest: t_typical)" if lat
                   else "message rate [Mpps]" if "Mpps" in name else "average bandwidth [MB/sec]"),
        "rounds": rounds, "runs": vals, "median": med, "ratio": round(ratio, 4),
        "paired_ratio": round(paired, 4), "paired_ratio_ci95": [round(lo, 4), round(hi, 4)],
        "target": target, "met": met, "verdict": verdict,
    })
doc = {
    "benchmark": "rdmabench vs perftest (each test against its twin), one rxe device on a veth pair in the lab guest (QEMU TCG)",
    "method": "alternating runs (perftest first on odd rounds, rdmabench first on even), server pinned to CPU 0 and client to CPU 1 for both tools; ratio = median of rdmabench's runs / median of perftest's; paired ratio = median over rounds of (rdmabench run / perftest run of the same round), which the target is judged on",
    "rounds": rounds,
    "cases": cases,
}
json.dump(doc, open("results/bench-rxe.json", "w"), indent=2)
lines = ["| case | metric | rdmabench median (min..max) | perftest median (min..max) | ratio of medians | paired ratio (95% CI) | target |",
         "|---|---|---|---|---|---|---|"]
for c in cases:
    r, p = c["spread"]["rdmabench"], c["spread"]["perftest"]
    lines.append(f"| {c['case']} | {c['metric']} | {c['median']['rdmabench']:.2f} ({r['min']:.2f}..{r['max']:.2f}) | "
                 f"{c['median']['perftest']:.2f} ({p['min']:.2f}..{p['max']:.2f}) | "
                 f"{c['ratio']:.3f} | {c['paired_ratio']:.3f} ({c['paired_ratio_ci95'][0]:.3f}..{c['paired_ratio_ci95'][1]:.3f}) | "
                 f"{c['target']} {c['verdict']} |")
open("results/bench-rxe.md", "w").write(
    f"# rdmabench vs perftest on soft-RoCE (lab guest, {rounds} alternating rounds)\n\n"
    "Latency: lower is better (ratio <= 1.00); bandwidth and message rate: higher is better (ratio >= 1.00).\n"
    "The target is judged on the paired ratio: the median over rounds of rdmabench's run divided by perftest's run of\n"
    "the same round (the guest drifts between fast and slow modes under TCG; a round's two runs share its mode).\n"
    "The interval is a bootstrap 95 % interval of that median: 'within noise' means it holds the target, so these\n"
    "runs cannot tell the tools apart; 'NOT met' means the whole interval is on the wrong side.\n\n" + "\n".join(lines) + "\n")
print("\n".join(lines))
