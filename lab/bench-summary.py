#!/usr/bin/env python3
"""Medians, paired ratios and their 95 % intervals from raw BENCH lines.

lab-bench-summary RAW ROUNDS [OUT_STEM TOOL_A TOOL_B]: ratios are TOOL_A / TOOL_B (default
rdmabench / perftest, written to results/bench-rxe.{json,md}). A BENCH line may carry its
case's "goal" (the ratio to reach) and "better" ("lower" or "higher"); otherwise they
follow from the case's name (latency: lower).
"""
import json, random, statistics, sys
raw, rounds = sys.argv[1], int(sys.argv[2])
stem = sys.argv[3] if len(sys.argv) > 3 else "results/bench-rxe"
tool_a, tool_b = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else ("rdmabench", "perftest")
def bootstrap_ci(xs, n=4000):
    """95 % percentile interval of the median of xs, by resampling (fixed seed: reproducible)."""
    rng = random.Random(7)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]

runs = [json.loads(l.split(" ", 1)[1]) for l in open(raw) if l.startswith("BENCH ")]
def medians(name, tool, keys):
    """Each of `keys`' median over the case's runs of `tool`, where the runs carry it."""
    return {k: statistics.median(xs) for k in keys
            if (xs := [r[k] for r in runs if r["case"] == name and r["tool"] == tool and k in r])}
cases = []
for name in dict.fromkeys(r["case"] for r in runs):
    vals = {t: [r["value"] for r in runs if r["case"] == name and r["tool"] == t] for t in (tool_a, tool_b)}
    first = next(r for r in runs if r["case"] == name)
    lat = first.get("better", "lower" if "-lat" in name else "higher") == "lower"
    med = {t: statistics.median(v) for t, v in vals.items()}
    ratio = med[tool_a] / med[tool_b]
    # Each round's two runs share the guest's state of the moment (its runs drift between
    # modes under TCG), so the median of the per-round ratios is the robust comparison.
    pairs = [a / b for a, b in zip(vals[tool_a], vals[tool_b])]
    paired = statistics.median(pairs)
    lo, hi = bootstrap_ci(pairs)
    goal = first.get("goal", 1.10 if "adaptive" in name else 1.00)
    target = f"<= {goal:.2f}" if lat else f">= {goal:.2f}"
    met = paired <= goal if lat else paired >= goal
    # Not met but the 95 % interval holds the goal: the runs cannot tell the two apart.
    worse = lo > goal if lat else hi < goal
    verdict = "met" if met else ("NOT met" if worse else "within noise")
    spread = {t: {"min": min(v), "max": max(v)} for t, v in vals.items()}
    # Latency: each run's fastest sample too. The guest flips between two speeds from minute
    # to minute and a run's median moves with it; its fastest sample moves far less, so a
    # verdict the medians give that the fastest samples contradict is only the guest's.
    fast = {t: [r["fastest"] for r in runs if r["case"] == name and r["tool"] == t and "fastest" in r]
            for t in (tool_a, tool_b)}
    fastest = None
    if lat and all(len(fast[t]) == len(vals[t]) > 0 for t in fast):
        fpairs = [a / b for a, b in zip(fast[tool_a], fast[tool_b])]
        flo, fhi = bootstrap_ci(fpairs)
        fastest = {"runs": fast, "paired_ratio": round(statistics.median(fpairs), 4),
                   "paired_ratio_ci95": [round(flo, 4), round(fhi, 4)],
                   "met": statistics.median(fpairs) <= goal}
        if not met and fastest["met"]:
            verdict = "within noise (the fastest samples meet it)"
    # CPU per message (us), each side's median, where the runs measured it (--cpu-util).
    cpu = {t: medians(name, t, ("cpu_us", "peer_cpu_us")) for t in (tool_a, tool_b)}
    # RC retransmissions during each run (the driver's counters, read around it, both tools
    # alike): ACK-timeout retries and the duplicate packets they made the responder drop.
    rtx = {t: medians(name, t, ("retries", "duplicates")) for t in (tool_a, tool_b)}
    cases.append({
        "case": name,
        "spread": spread,
        "metric": first.get("metric") or (("p50 latency [usec] (perftest: t_typical)" if tool_b == "perftest" else "p50 latency [usec]") if lat
                   else "message rate [Mpps]" if "Mpps" in name else "average bandwidth [MB/sec]"),
        "rounds": rounds, "runs": vals, "median": med, "ratio": round(ratio, 4),
        "paired_ratio": round(paired, 4), "paired_ratio_ci95": [round(lo, 4), round(hi, 4)],
        "target": target, "met": met, "verdict": verdict,
        **({"fastest_sample": fastest} if fastest else {}),
        **({"cpu_us_per_message": cpu} if any(cpu.values()) else {}),
        **({"retransmissions_per_run": rtx} if all(rtx.values()) else {}),
    })
if tool_b == "perftest":
    what = "rdmabench vs perftest (each test against its twin)"
    method = ("alternating runs (perftest first on odd rounds, rdmabench first on even), server pinned to CPU 0 and "
              "client to CPU 1 for both tools")
else:
    what = f"{tool_a} vs {tool_b} (rdmabench's own tests, same sizes)"
    method = (f"alternating runs ({tool_b} first on odd rounds, {tool_a} first on even), server pinned to CPU 0 and "
              "client to CPU 1 for both")
doc = {
    "benchmark": f"{what}, one rxe device on a veth pair in the lab guest (QEMU TCG)",
    "method": f"{method}; ratio = median of {tool_a}'s runs / median of {tool_b}'s; paired ratio = median over rounds of "
              f"({tool_a} run / {tool_b} run of the same round), which the target is judged on",
    "rounds": rounds,
    "cases": cases,
}
json.dump(doc, open(f"{stem}.json", "w"), indent=2)
lines = [f"| case | metric | {tool_a} median (min..max) | {tool_b} median (min..max) | ratio of medians | paired ratio (95% CI) | paired ratio of fastest samples (95% CI) | target |",
         "|---|---|---|---|---|---|---|---|"]
for c in cases:
    r, p = c["spread"][tool_a], c["spread"][tool_b]
    lines.append(f"| {c['case']} | {c['metric']} | {c['median'][tool_a]:.2f} ({r['min']:.2f}..{r['max']:.2f}) | "
                 f"{c['median'][tool_b]:.2f} ({p['min']:.2f}..{p['max']:.2f}) | "
                 f"{c['ratio']:.3f} | {c['paired_ratio']:.3f} ({c['paired_ratio_ci95'][0]:.3f}..{c['paired_ratio_ci95'][1]:.3f}) | "
                 + (f"{f['paired_ratio']:.3f} ({f['paired_ratio_ci95'][0]:.3f}..{f['paired_ratio_ci95'][1]:.3f}) | "
                    if (f := c.get("fastest_sample")) else "| ")
                 + f"{c['target']} {c['verdict']} |")
def side_by_side(key, heading, cell):
    """A table of the cases that have `key`: each tool's `cell` of it, beside the other's."""
    shown = [c for c in cases if key in c]
    if not shown:
        return []
    return (["", heading, "", f"| case | {tool_a} | {tool_b} |", "|---|---|---|"]
            + [f"| {c['case']} | {cell(c[key][tool_a])} | {cell(c[key][tool_b])} |" for c in shown])
lines += side_by_side("cpu_us_per_message",
                      f"CPU time per record/message, median, us (client / server): {tool_a} against {tool_b}",
                      lambda m: " / ".join(f"{m.get(k, float('nan')):.2f}" for k in ("cpu_us", "peer_cpu_us")))
lines += side_by_side("retransmissions_per_run",
                      "RC retransmissions per run, median: ACK-timeout retries / duplicate packets dropped by the "
                      f"responder (the devices' hw_counters read around each run, {tool_a} and {tool_b} alike)",
                      lambda m: " / ".join(f"{m[k]:g}" for k in ("retries", "duplicates")))
open(f"{stem}.md", "w").write(
    f"# {what} on soft-RoCE (lab guest, {rounds} alternating rounds)\n\n"
    "Latency: lower is better; bandwidth and message rate: higher is better. Each case's target is a ratio.\n"
    f"The target is judged on the paired ratio: the median over rounds of {tool_a}'s run divided by {tool_b}'s run of\n"
    "the same round (the guest drifts between fast and slow modes under TCG; a round's two runs share its mode).\n"
    "The interval is a bootstrap 95 % interval of that median: 'within noise' means it holds the target, so these\n"
    "runs cannot tell the two apart; 'NOT met' means the whole interval is on the wrong side. For latency the\n"
    "fastest sample of each run is paired the same way: a median verdict that the fastest samples contradict\n"
    "is called within noise (the guest's two speeds), never met.\n\n" + "\n".join(lines) + "\n")
print("\n".join(lines))
