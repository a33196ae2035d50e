"""The derived numbers of docs/perf/2026-12-04-h200.md's "Run 8" section (percentages, ratios,
rates), from run 8's logs next to this file and run 7's in ../run7. The bench CSVs are read;
numbers quoted from the text logs (ablate, ablate2, overhead, timm) are copied here with the log
named.

    python docs/perf/2026-12-04-h200/run8/derived.py
"""

import csv
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN7 = HERE.parent / "run7"
MB = 67.108864  # the headline layer's input at N = 128 (ablate's 'read' line: 67.1 MB)


def pct(new, old):
    return 100 * (new / old - 1)


def bench(path):
    return {(r["layer"], int(r["n"]), r["pass"], r["impl"]): r for r in csv.DictReader(open(path))}


def us(row):
    return float(row["median_ms"]) * 1e3


print("== bench (bench/bench_fp16.csv against run7/bench/bench_fp16.csv)")
b7, b8 = bench(RUN7 / "bench" / "bench_fp16.csv"), bench(HERE / "bench" / "bench_fp16.csv")
cases = [k[:3] for k in b8 if k[3] == "spio"]
for k in cases:
    if k[0] == "64c_64x64_3x3":
        s7, s8 = us(b7[k + ("spio",)]), us(b8[k + ("spio",)])
        print(f"{k}: run8 {s8:.1f} us ({100 * us(b8[k + ('copy',)]) / s8:.0f} % of copy, "
              f"{us(b8[k + ('torch',)]) / s8:.2f}x), run7 {s7:.1f} us "
              f"({100 * us(b7[k + ('copy',)]) / s7:.0f} %, {us(b7[k + ('torch',)]) / s7:.2f}x); "
              f"{pct(s8, s7):+.1f} %")
sp7 = [us(b7[k + ("torch",)]) / us(b7[k + ("spio",)]) for k in cases]
sp8 = [us(b8[k + ("torch",)]) / us(b8[k + ("spio",)]) for k in cases]
print(f"speedup run8 median {statistics.median(sp8):.2f} min {min(sp8):.2f} max {max(sp8):.2f}; "
      f"run7 median {statistics.median(sp7):.2f} min {min(sp7):.2f} max {max(sp7):.2f}")
print("min at", cases[sp8.index(min(sp8))], "max at", cases[sp8.index(max(sp8))])
print("losses run8:", [(k, round(s, 2)) for k, s in zip(cases, sp8) if s < 1])
print("FProp/DGrad lowest speedup:", min((s, k) for k, s in zip(cases, sp8) if k[2] != "wgrad"))
print("same config and rotation sets in every case:",
      all(b7[k + ("spio",)]["config"] == b8[k + ("spio",)]["config"]
          and b7[k + ("spio",)]["rotation_sets"] == b8[k + ("spio",)]["rotation_sets"] for k in cases))
for p in ("fprop", "dgrad", "wgrad"):
    ch = sorted((pct(us(b8[k + ("spio",)]), us(b7[k + ("spio",)])), k) for k in cases if k[2] == p)
    print(f"{p}: spio time run8/run7 median {statistics.median(c for c, _ in ch):+.1f} %, "
          f"min {ch[0][0]:+.1f} % {ch[0][1][:2]}, max {ch[-1][0]:+.1f} % {ch[-1][1][:2]}; "
          f"slower by > 3 %: {sum(c > 3 for c, _ in ch)} of {len(ch)}")
for k in cases:
    s7, s8 = us(b7[k + ("spio",)]), us(b8[k + ("spio",)])
    if k[2] == "wgrad" and abs(pct(s8, s7)) >= 3:
        print(f"  WGrad {k[:2]}: {s7:.1f} -> {s8:.1f} us ({pct(s8, s7):+.1f} %)")
for k in cases:
    t7, t8 = us(b7[k + ("torch",)]), us(b8[k + ("torch",)])
    if abs(pct(t8, t7)) >= 10:
        print(f"  cuDNN {k}: {t7:.1f} -> {t8:.1f} us ({pct(t8, t7):+.0f} %), speedup "
              f"{t7 / us(b7[k + ('spio',)]):.2f}x -> {t8 / us(b8[k + ('spio',)]):.2f}x")

print("== zeros by stores (full etc.) against zero-filling copies (zfill etc.), same process")
# (pass, config, variant pair): (stores, zfill), from ablate.log (gpu_check, --repeats 30)
# and ablate2.log (call 2's second command, --repeats 30)
pairs = {
    ("fprop pick g8_p64_q32_w1_s4_k16", "full"): (52.2, 51.7),
    ("fprop pick g8_p64_q32_w1_s4_k16", "loads-only"): (38.7, 38.7),
    ("fprop pick g8_p64_q32_w1_s4_k16", "pipeline-only"): (38.0, 38.1),
    ("dgrad pick g8_p64_q32_w1_s3_k16", "full"): (52.1, 52.0),
    ("dgrad pick g8_p64_q32_w1_s3_k16", "loads-only"): (39.9, 39.9),
    ("dgrad pick g8_p64_q32_w1_s3_k16", "pipeline-only"): (39.6, 39.6),
    ("wgrad pick g2_p64_q32_n1_w4_s2_k16", "full"): (86.6, 83.6),
    ("wgrad pick g2_p64_q32_n1_w4_s2_k16", "loads-only"): (77.3, 76.0),
    ("fprop g8_p64_q16_w1_s2_k16", "full"): (63.4, 63.3),
    ("fprop g8_p64_q16_w1_s2_k16", "pipeline-only"): (49.1, 49.5),
    ("fprop g8_p64_q16_w1_s4_k16", "full"): (53.9, 53.8),
    ("fprop g8_p64_q16_w1_s4_k16", "pipeline-only"): (39.8, 39.8),
    ("fprop g8_p64_q32_w1_s6_k16", "full"): (51.3, 51.1),
    ("fprop g8_p64_q32_w1_s6_k16", "pipeline-only"): (37.8, 37.9),
    ("fprop g8_p64_q64_w2_s4_k16", "full"): (52.0, 51.8),
    ("fprop g8_p64_q64_w2_s4_k16", "pipeline-only"): (38.1, 37.9),
    ("wgrad g2_p32_q64_n4_w4_s6_k8", "full"): (77.6, 81.2),
    ("wgrad g2_p32_q64_n4_w4_s6_k8", "loads-only"): (67.8, 67.6),
    ("wgrad g2_p64_q64_n1_w8_s2_k16 (trial)", "full"): (81.2, 78.8),
    ("wgrad g2_p64_q64_n1_w8_s2_k16 (trial)", "loads-only"): (75.6, 74.5),
    ("512c 8x8 fprop g2_p8_q16_w1_s4_k16", "full"): (15.2, 15.5),
    ("512c 8x8 wgrad g8_p8_q8_n4_w1_s6_k8", "full"): (34.8, 33.3),
    ("368c 7x7 fprop g2_p8_q16_w1_s4_k16", "full"): (12.1, 12.4),
    ("368c 7x7 wgrad g4_p8_q8_n4_w1_s6_k8", "full"): (28.8, 26.7),
}
for (what, variant), (s, z) in pairs.items():
    print(f"{what:40s} {variant:14s} stores {s:5.1f} zfill {z:5.1f}  {s - z:+.1f} us {pct(s, z):+.1f} %")
pipe = [v for (w, var), v in pairs.items() if var == "pipeline-only" and w.startswith("fprop")]
print(f"FProp pipeline-only, 5 configs: stores/zfill {min(pct(s, z) for s, z in pipe):+.1f} .. "
      f"{max(pct(s, z) for s, z in pipe):+.1f} %; read rates stores "
      f"{MB / max(s for s, _ in pipe):.2f}-{MB / min(s for s, _ in pipe):.2f} TB/s, zfill "
      f"{MB / max(z for _, z in pipe):.2f}-{MB / min(z for _, z in pipe):.2f} TB/s")
fulls = [v for (w, var), v in pairs.items() if var == "full" and w.startswith(("fprop", "dgrad"))]
print(f"FProp/DGrad full, headline layer ({len(fulls)}): stores/zfill {min(pct(s, z) for s, z in fulls):+.1f} .. "
      f"{max(pct(s, z) for s, z in fulls):+.1f} %")
lo = [v for (w, var), v in pairs.items() if var == "loads-only" and w.startswith("wgrad")]
print(f"WGrad loads-only (3 configs): stores/zfill {min(pct(s, z) for s, z in lo):+.1f} .. "
      f"{max(pct(s, z) for s, z in lo):+.1f} %; pick's x+dy 134.2 MB at {134.217728 / 77.3:.2f} "
      f"TB/s (stores), {134.217728 / 76.0:.2f} (zfill)")
print(f"probe rows (run 7, 4,352 B, 512 threads, 4 buffers) 23.9 us: pipeline-only 37.8-49.1 us "
      f"is {37.8 / 23.9:.2f}-{49.1 / 23.9:.2f}x; pick 38.0 is {38.0 / 23.9:.2f}x; 2.80 TB/s probe = "
      f"{MB / 23.9:.2f}")
print(f"pick's pipeline-only 38.0 vs loads-only 38.7: {38.0 - 38.7:+.1f} us; DGrad 39.6 vs 39.9: "
      f"{39.6 - 39.9:+.1f}")
print(f"run 7's pipeline-only (zfill form then) vs run 8's zfill-pipeline-only: q64 37.9 -> 37.9, "
      f"q16 s4 40.1 -> 39.8 ({pct(39.8, 40.1):+.1f} %), q16 s2 49.9 -> 49.5 ({pct(49.5, 49.9):+.1f} %)")
print(f"WGrad wrappers (ablate.log): g2_p32_q64_n4_w4_s6_k8 partials+sum 76.9 vs pick's 86.2: "
      f"{pct(76.9, 86.2):+.1f} %; trial 80.6 ({pct(80.6, 86.2):+.1f} %)")

print("== classic ablation (ablate2.log, default repeats) against run 7's")
# full, no-stores, no-loads, skeleton, loads-only (no-mma and no-sync not run in run 8)
r7 = {"fprop": [53.0, 40.6, 28.9, 20.2, 39.3], "dgrad": [53.0, 41.9, 25.3, 20.3, 40.3],
      "wgrad": [85.1, 77.8, 43.4, 28.7, 76.7]}
r8 = {"fprop": [52.3, 40.4, 28.9, 19.9, 39.0], "dgrad": [52.2, 41.3, 25.3, 20.1, 39.9],
      "wgrad": [86.8, 78.3, 43.1, 28.6, 77.2]}
d = [(r8[p][i] - r7[p][i], pct(r8[p][i], r7[p][i]), p, i) for p in r7 for i in range(5)]
print(f"run8 - run7: {min(x[0] for x in d):+.1f} .. {max(x[0] for x in d):+.1f} us "
      f"({min(x[1] for x in d):+.1f} .. {max(x[1] for x in d):+.1f} %)")
print(f"stores' share (full - no-stores): FProp {52.3 - 40.4:.1f}, DGrad {52.2 - 41.3:.1f}, "
      f"WGrad {86.8 - 78.3:.1f} us; loads-only FProp {MB / 39.0:.2f} TB/s, DGrad {MB / 39.9:.2f}, "
      f"WGrad x+dy {134.217728 / 77.2:.2f}")
print(f"WGrad headline wrapper partials+sum / atomic+zero: {86.2 / 96.5:.3f} (ablate), "
      f"{86.8 / 96.8:.3f} (ablate2)")

print("== small layers (ablate2.log, --repeats 30) against run 7's")
small = {  # (run 8 full, run 8 loads-only, run 7 full, run 7 loads-only)
    "512c FProp": (15.2, 10.2, 15.8, 10.8), "512c WGrad": (34.8, 16.9, 32.9, 17.1),
    "368c FProp": (12.1, 8.7, 12.6, 9.3), "368c WGrad": (28.8, 14.3, 27.2, 14.2),
}
for k, (f8, l8, f7, l7) in small.items():
    print(f"{k}: full {f7} -> {f8} ({pct(f8, f7):+.1f} %), loads-only / full {l8 / f8:.2f} "
          f"(run 7 {l7 / f7:.2f})")
print(f"WGrad partials+sum / atomic+zero: 512c {34.9 / 38.7:.3f}, 368c {28.7 / 33.4:.3f}")

print("== overhead (overhead.log; run 7's in ../run7/overhead.log)")
ov = {  # case: (run 8, run 7), host us a call / step (median)
    "F.conv2d": (19.88, 31.80), "op": (40.68, 69.72), "functional": (19.70, 33.87),
    "nn.Conv2d": (23.29, 38.51), "Conv2dGw8": (26.71, 46.65),
    "step nn.Conv2d": (212.67, 286.50), "step Conv2dGw8": (319.53, 517.70),
}
for k, (a, b) in ov.items():
    print(f"{k}: run7/run8 {b / a:.2f}x")
print(f"training step: Conv2dGw8 / nn.Conv2d run8 {319.53 / 212.67:.2f}, run7 {517.70 / 286.50:.2f}; "
      f"difference of medians run8 {319.53 - 212.67:.1f}, run7 {517.70 - 286.50:.1f}; paired "
      f"median run8 +107.90 / nn.Conv2d {107.90 / 212.67:.2f}, run7 +197.99 / {197.99 / 286.50:.2f}; "
      f"paired run8/run7 {107.90 / 197.99:.2f}")
print(f"profiled self us a step, run8/run7: _Conv2dGw8Backward {74.61 / 135.94:.2f}, _Conv2dGw8 "
      f"{45.95 / 75.67:.2f}, aten::empty x6 {30.25 / 52.19:.2f}, cuLaunchKernel x4 "
      f"{24.12 / 38.96:.2f}")
print(f"launch probe run8/run7: no args {4.62 / 4.04:.2f}, tensor {5.41 / 5.09:.2f}, Pointer "
      f"{5.01 / 5.88:.2f}, fill_ {8.01 / 7.82:.2f}")

print("== timm (timm.log; run 7's in ../run7/timm.log), batch 256")
timm8 = {"pytorch": (10605.1, 11123.9, 546.0, 120.0), "spio": (9635.8, 10906.8, 561.0, 117.0),
         "spio-faster": (12323.2, 10810.4, 549.0, 117.0)}
timm7 = {"pytorch": (13428.0, 11203.4, 547.0, 118.0), "spio": (12108.0, 10957.5, 562.0, 118.0),
         "spio-faster": (10214.3, 10877.4, 550.0, 118.0)}
for run, t in (("run8", timm8), ("run7", timm7)):
    step0 = 256 / t["pytorch"][0] * 1e6
    for name, (sps, gpu, launches, mem) in t.items():
        step = 256 / sps * 1e6
        print(f"{run} {name}: {sps / t['pytorch'][0]:.3f} of pytorch; step {step:.0f} us "
              f"({step - step0:+.0f}), GPU {gpu} ({gpu - t['pytorch'][1]:+.1f}), busy "
              f"{100 * gpu / step:.1f} %, GPU idle {step - gpu:.0f} us; launches {launches:.0f} "
              f"({launches - t['pytorch'][2]:+.0f}), memcpy/memset {mem:.0f}")
for name in timm8:
    print(f"{name}: samples/s run8/run7 {timm8[name][0] / timm7[name][0]:.2f}; step "
          f"{256 / timm8[name][0] * 1e6 - 256 / timm7[name][0] * 1e6:+.0f} us")
print("fp16 strided copy new with spio (us a step): run8 spio 28.0, spio-faster 28.3; "
      "run7 28.4, 28.8; spio_sum_slots run8 24.8 / 7.4, run7 31.8 / 10.0")

print("== lease")
print(f"runs 7 and 8 held 818 s of 900; run 7's record: held 568.6 s -> run 8 {818 - 568.6:.1f} s; "
      f"call 1 179.0 s + call 2 23.9 s = {179.0 + 23.9:.1f} s of command")

print("== timm kernels (timm.log 'grew most' lists; run 7's in ../run7/timm.log), us a step")
grew = {"368c wgrad": (231.0, 223.8), "368c dgrad": (99.7, 104.1), "368c fprop": (98.0, 102.3),
        "152c wgrad": (83.4, 77.3), "152c dgrad": (49.2, 49.7), "152c fprop": (41.3, 40.0),
        "fp16 copy": (28.0, 28.4), "sum_slots": (24.8, 31.8)}
for k, (a, b) in grew.items():
    print(f"spio {k}: run7 {b} -> run8 {a} ({pct(a, b):+.1f} %)")
print(f"GPU time a step run8 - run7: pytorch {11123.9 - 11203.4:+.1f}, spio {10906.8 - 10957.5:+.1f}, "
      f"spio-faster {10810.4 - 10877.4:+.1f}")
