"""The derived numbers of docs/perf/2026-12-04-h200.md's "Run 7" section (percentages, ratios,
rates), from run 7's logs next to this file and run 6's one level up. CSVs are read; numbers
quoted from the text logs (ablate, probe, overhead, timm) are copied here with the log named.

    python docs/perf/2026-12-04-h200/run7/derived.py
"""

import collections
import csv
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN6 = HERE.parent


def bench(path):
    return {(r["layer"], int(r["n"]), r["pass"], r["impl"]): r for r in csv.DictReader(open(path))}


def us(row):
    return float(row["median_ms"]) * 1e3


b6, b7 = bench(RUN6 / "bench_fp16.csv"), bench(HERE / "bench" / "bench_fp16.csv")
cases = [k[:3] for k in b7 if k[3] == "spio"]
print("== bench (bench_fp16.csv)")
for k in cases:
    if k[0] == "64c_64x64_3x3":
        s6, s7 = us(b6[k + ("spio",)]), us(b7[k + ("spio",)])
        print(f"{k}: run7 {s7:.1f} us ({100 * us(b7[k + ('copy',)]) / s7:.0f} % of copy, "
              f"{us(b7[k + ('torch',)]) / s7:.2f}x), run6 {s6:.1f} us ({us(b6[k + ('torch',)]) / s6:.2f}x)")
sp6 = [us(b6[k + ("torch",)]) / us(b6[k + ("spio",)]) for k in cases]
sp7 = [us(b7[k + ("torch",)]) / us(b7[k + ("spio",)]) for k in cases]
print(f"speedup run7 median {statistics.median(sp7):.2f} min {min(sp7):.2f} max {max(sp7):.2f}; "
      f"run6 median {statistics.median(sp6):.2f} min {min(sp6):.2f} max {max(sp6):.2f}")
print("losses run7:", [(k, round(s, 2)) for k, s in zip(cases, sp7) if s < 1])
fd = [(s, k) for k, s in zip(cases, sp7) if k[2] != "wgrad"]
print("FProp/DGrad lowest speedup:", min(fd))
change = [(100 * (us(b7[k + ("spio",)]) / us(b6[k + ("spio",)]) - 1), k) for k in cases]
print(f"spio time run7/run6: median {statistics.median(c for c, _ in change):+.1f} %, "
      f"min {min(change)[0]:+.1f} % {min(change)[1]}, max {max(change)[0]:+.1f} % {max(change)[1]}")
print("same config and rotation sets in every case:",
      all(b6[k + ("spio",)]["config"] == b7[k + ("spio",)]["config"]
          and b6[k + ("spio",)]["rotation_sets"] == b7[k + ("spio",)]["rotation_sets"] for k in cases))
for k in cases:
    t6, t7 = us(b6[k + ("torch",)]), us(b7[k + ("torch",)])
    if abs(t7 / t6 - 1) >= 0.05:
        print(f"cuDNN {k}: {t6:.1f} -> {t7:.1f} us ({100 * (t7 / t6 - 1):+.0f} %), speedup "
              f"{t6 / us(b6[k + ('spio',)]):.2f}x -> {t7 / us(b7[k + ('spio',)]):.2f}x")

print("== ablate (ablate.log); FProp's input: 67.1 MB (its 'read' line)")
MB = 67.108864
r6 = {"fprop": [52.8, 40.3, 51.3, 28.6, 19.9, 38.5, 52.4], "dgrad": [53.2, 41.7, 52.1, 25.0, 20.1, 40.1, 53.2],
      "wgrad": [84.7, 77.5, 83.7, 42.9, 27.6, 76.3, 80.5]}  # run 6's record
r7 = {"fprop": [53.0, 40.6, 51.6, 28.9, 20.2, 39.3, 53.2], "dgrad": [53.0, 41.9, 52.1, 25.3, 20.3, 40.3, 53.4],
      "wgrad": [85.1, 77.8, 84.0, 43.4, 28.7, 76.7, 80.7]}
d = [(r7[p][i] - r6[p][i], 100 * (r7[p][i] / r6[p][i] - 1)) for p in r6 for i in range(7)]
print(f"classic ablation run7 - run6: {min(x for x, _ in d):+.1f} .. {max(x for x, _ in d):+.1f} us, "
      f"largest {max(y for _, y in d):+.1f} %")
print(f"stores' share: FProp {53.0 - 40.6:.1f} us, DGrad {53.0 - 41.9:.1f} us; "
      f"loads-only FProp {MB / 39.3:.2f} TB/s, DGrad {MB / 40.3:.2f}; WGrad loads-only x+dy 134.2 MB "
      f"{134.217728 / 76.7:.2f} TB/s")
pipe = {  # config: full, ldg, loads-only, ldg-loads-only, pipeline-only, ldg-pipeline-only
    "g8_p64_q64_w2_s4_k16": (52.6, 53.0, 38.4, 31.0, 37.9, 27.5),
    "g8_p64_q16_w1_s4_k16": (54.6, 60.4, 40.7, 25.8, 40.1, 22.7),
    "g8_p64_q16_w1_s2_k16": (64.5, 51.1, 49.6, 30.9, 49.9, 27.6),
}
for cfg, (full, ldg, lo, ldglo, po, ldgpo) in pipe.items():
    print(f"{cfg}: pipeline-only {po} us = {MB / po:.2f} TB/s, ldg-pipeline-only {ldgpo} us = "
          f"{MB / ldgpo:.2f} TB/s, loads-only {MB / lo:.2f}, ldg-loads-only {MB / ldglo:.2f}; "
          f"pipeline-only - loads-only {po - lo:+.1f} us; ldg/full {100 * (ldg / full - 1):+.1f} %")
print(f"stores-cs / full {100 * (53.4 / 52.8 - 1):+.1f} %; l2-256 / full FProp pick "
      f"{100 * (52.9 / 52.8 - 1):+.1f} %, WGrad pick {100 * (88.3 / 84.4 - 1):+.1f} %")
l2 = [(64.5, 64.7), (54.4, 53.8), (55.3, 54.6), (52.2, 51.7), (52.8, 52.0), (55.4, 55.0), (60.7, 59.7)]
print("l2-256 / full, FProp tile shapes: " + " ".join(f"{100 * (l / f - 1):+.1f}" for f, l in l2))
print(f"WGrad ldg / full {100 * (94.0 / 81.7 - 1):+.1f} %, {100 * (110.4 / 83.5 - 1):+.1f} %; "
      f"ldg-loads-only / loads-only {100 * (63.0 / 68.2 - 1):+.1f} %, {100 * (79.5 / 73.6 - 1):+.1f} %; "
      f"trial g2_p32_q64_n4_w4_s6_k8 wrapper 81.0 / pick 85.0 {100 * (81.0 / 85.0 - 1):+.1f} %")
print(f"small layers, skeleton / full: 512c FProp {8.9 / 15.8:.2f} WGrad {22.8 / 32.9:.2f}; "
      f"368c FProp {6.7 / 12.6:.2f} WGrad {18.7 / 27.2:.2f}; loads-only / full WGrad "
      f"{17.1 / 32.9:.2f}, {14.2 / 27.2:.2f}")
red = {"64c": (84.5, 113.3), "128c": (54.4, 62.8), "256c": (32.6, 35.2), "512c": (32.7, 36.0),
       "96c": (140.5, 139.9), "192c": (91.9, 86.9), "1x3": (41.0, 39.6), "3x1": (42.2, 43.9),
       "152c": (25.0, 32.4), "368c": (27.1, 30.4)}
print("partials+sum / atomic+zero: " + ", ".join(f"{k} {p / a:.3f}" for k, (p, a) in red.items()))

print("== probe (probe.log), 64 MiB = 67.1 MB a probe")
for label, t in (("rows 4352 B depth 4 x512", 23.9), ("depth 8 x512", 22.3), ("depth 4 x288", 23.5)):
    print(f"{label}: {MB / t:.2f} TB/s; pipeline-only 37.9-49.9 us is {37.9 / t:.2f}-{49.9 / t:.2f}x")
p6 = [24.4, 35.8, 21.6, 20.1, 20.1, 37.5, 36.9, 38.2, 45.4, 23.7, 20.5, 23.4, 20.4, 21.3, 30.7, 22.3, 20.8, 19.5, 20.3]
p7 = [24.1, 35.7, 21.5, 20.0, 19.7, 37.6, 37.1, 38.0, 45.1, 23.5, 20.3, 23.5, 20.3, 21.0, 30.5, 22.0, 20.8, 19.4, 20.1]
r = [100 * (b / a - 1) for a, b in zip(p6, p7)]
print(f"probes run 6 also had: run7/run6 {min(r):+.1f} .. {max(r):+.1f} %")

print("== overhead (overhead.log)")
print(f"F.conv2d run6/run7 {38.39 / 31.80:.2f}x; training step difference of medians "
      f"{517.70 - 286.50:.1f} us (paired median: +197.99), ratio {517.70 / 286.50:.2f}")

print("== timm (timm.log), batch 256")
timm = {"pytorch": (13428.0, 11203.4, 547.0), "spio": (12108.0, 10957.5, 562.0),
        "spio-faster": (10214.3, 10877.4, 550.0)}
step0 = 256 / timm["pytorch"][0] * 1e6
for name, (sps, gpu, launches) in timm.items():
    step = 256 / sps * 1e6
    print(f"{name}: {sps / timm['pytorch'][0]:.3f} of pytorch; step {step:.0f} us "
          f"({step - step0:+.0f}), GPU {gpu} us ({gpu - timm['pytorch'][1]:+.1f}), busy "
          f"{100 * gpu / step:.1f} %, GPU idle {step - gpu:.0f} us; launches {launches}")
print(f"run7/run6 samples/s: pytorch {13428.0 / 10082.4:.2f}, spio {12108.0 / 8592.4:.2f}, "
      f"spio-faster {10214.3 / 8893.7:.2f}")

print("== perf samples (perf_samples.csv)")
names = {("64", "64"): "64c 64x64 3x3", ("128", "32"): "128c 32x32 3x3", ("256", "16"): "256c 16x16 3x3",
         ("512", "8"): "512c 8x8 3x3", ("96", "56"): "96c 56x56 5x5"}


def rows(path):
    return list(csv.DictReader(open(path)))


cfg = None


def key(r):
    return tuple(v for c, v in r.items() if c not in ("time_us", "bandwidth_gbs", "date"))


s6, s7 = rows(RUN6 / "perf_samples.csv"), rows(HERE / "perf_samples.csv")
t6 = {key(r): float(r["time_us"]) for r in s6}
t7 = {key(r): float(r["time_us"]) for r in s7}
same = sum(1 for a, b in zip(s6, s7) if key(a) == key(b))
ratio = sorted(t7[k] / t6[k] for k in t6 if k in t7)
print(f"run6 {len(s6)} rows, run7 {len(s7)}: run7's first {same} rows are run6's configs in run6's "
      f"order; common {len(ratio)}, new {len(set(t7) - set(t6))}; time run7/run6 median "
      f"{statistics.median(ratio):.3f}, p10 {ratio[len(ratio) // 10]:.3f}, p90 {ratio[9 * len(ratio) // 10]:.3f}")
count = collections.Counter(
    (names[(r["c"], r["h"])], r["family"].removeprefix("conv2d_gw8_"), r["n"]) for r in s7 if key(r) not in t6)
print("new rows:", sorted(count.items()))
best = collections.defaultdict(lambda: 1e9)
for r in s7:
    if r["variant"] != "atomic":
        k = (names[(r["c"], r["h"])], int(r["n"]), r["family"].removeprefix("conv2d_gw8_"))
        best[k] = min(best[k], float(r["time_us"]))
layer = {v: k for k, v in {"512c_8x8_3x3": "512c 8x8 3x3", "96c_56x56_5x5": "96c 56x56 5x5",
                           "64c_64x64_3x3": "64c 64x64 3x3"}.items()}
for k in sorted(best):
    if k[0] in layer:
        pick = us(b7[(layer[k[0]], k[1], k[2], "spio")])
        print(f"{k}: bench pick {pick:.1f} / best sampled {best[k]:.1f} = {pick / best[k]:.2f}")
