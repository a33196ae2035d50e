"""How fast this GPU reads, through each load path spio's kernels use, next to torch's own kernels.

On the H200 (docs/perf/2026-11-29-h200-2.md) the FProp kernel's input pipeline alone read the 64c
64x64 layer's 67 MB at about 1.65 TB/s in every tile config, while a device copy moved 134 MB in
38 µs, reading at about the same rate while it also wrote. This script tells apart what could
cap it: the memory system's read rate (torch's sum, a pure read), cp.async itself against plain
loads into registers, the convolution's row-by-row structure with a barrier per row, DRAM
channel camping when lockstep blocks read rows a power of 2 apart (an image stride of 512 KB
against 528 KB), and, on sm_90, whether bulk copies (cp.async.bulk, one thread per row) read
faster than per-thread cp.async.

Each probe (spio/src/read_probe.cu) reads the same number of bytes; times are medians of CUDA-event
timed calls, the input rotated through copies when it would fit in L2 (as spio bench does).

    python scripts/read_probe.py [--mbytes 64] [--repeats 30]
"""

from __future__ import annotations

import argparse

from spio.args import no_gpu, run_script


def probes(total: int, sms: int, arch: str) -> list:
    """The probes for `total` bytes of reads (a multiple of 512 KiB): plain loads and cp.async over
    contiguous regions; the headline FProp's pattern (one block per 512 KiB image, rows of 8 KiB,
    in lockstep) at a power-of-2 stride and at a stride that is not; short tiles (8 rows per
    block), whose blocks are not in lockstep; the headline FProp config's row size and block
    shape (rows of 4,352 B, 272 of 512 threads copying); and on sm_90 and newer, the same rows
    by bulk copies (one thread, one instruction per row: does the copy engine read faster?)."""
    from spio.bench.probe import Probe
    from spio.compiler.arch import has_bulk_copies

    image = 512 * 1024
    images = total // image
    blocks = 8 * sms
    region = (total // blocks) // 16 * 16
    found = []
    for depth in (1, 4, 8):
        found.append(Probe("ldg", blocks, 256, depth, region, region))
    for depth in (2, 4, 8):
        found.append(Probe("cp.async", blocks, 256, depth, region, region))
    for depth in (2, 4, 8):
        found.append(Probe("rows", images, 512, depth, image, image, row_bytes=8192))
    for depth in (4, 8):
        found.append(Probe("rows", images, 512, depth, image, image + 16 * 1024, row_bytes=8192))
    found.append(Probe("rows", 8 * images, 512, 4, image // 8, image // 8, row_bytes=8192))
    # The headline FProp config's own geometry (g8_p64_q32_w1_s4_k16 on 64c 64x64: two blocks of
    # 512 threads an SM, input rows of 34 pixels x 128 B, so 272 of the 512 threads copy a row):
    # run 6 read at 1.75 TB/s in its loads-only ablation where the 8 KB rows above reached
    # 2.8-3.3. Rows of that size, with 4 and 8 buffers, and with 288 threads (all but 16 copy).
    row = 34 * 128
    region = 64 * row
    for depth in (4, 8):
        found.append(Probe("rows", total // region, 512, depth, region, region, row_bytes=row))
    found.append(Probe("rows", total // region, 288, 4, region, region, row_bytes=row))
    # The same rows, and the kernel's own 8 KB rows, landing in shared memory as the kernels
    # stage them (each group's pixels together, a run padded to odd): runs 7 and 8 read at
    # 1.7 TB/s in the kernels' input pipeline alone where these rows in order reach 2.8 (and
    # whether the copies land in order is the one difference left between the two).
    for size, blocks in ((row, total // region), (8192, images)):
        found.append(Probe("rows", blocks, 512, 4, 64 * size, 64 * size, size, groups=8))
    if has_bulk_copies(arch):
        for depth in (2, 4, 8):
            found.append(Probe("bulk", images, 128, depth, image, image, row_bytes=8192))
        found.append(Probe("bulk", images, 128, 4, image, image, row_bytes=32768))
        found.append(Probe("bulk", 8 * images, 128, 4, image // 8, image // 8, row_bytes=8192))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=int, default=64, help="MiB each probe reads")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if args.mbytes < 1 or args.repeats < 1:
        parser.error(f"--mbytes and --repeats must be positive, got {args.mbytes}, {args.repeats}")

    import torch

    if not torch.cuda.is_available():
        return no_gpu("read_probe")

    from spio.bench.timing import Rotation, l2_cache_bytes, rotation_sets, time_calls
    from spio.compiler import compile_many
    from spio.cuda import driver

    device = torch.device("cuda", torch.cuda.current_device())
    attrs = driver.device_attributes(device.index)
    total = args.mbytes << 20
    found = probes(total, attrs["sm_count"], attrs["arch"])
    compile_many([p.kernel().compile_job(attrs["arch"]) for p in found], progress=False)
    span = max(p.span_bytes for p in found)
    sets = rotation_sets(span, l2_cache_bytes(device.index))
    data = [torch.randint(0, 256, (span,), dtype=torch.uint8, device=device) for _ in range(sets)]
    print(f"{attrs['name']} ({attrs['arch']}): {args.mbytes} MiB per probe, {sets} rotated copies")
    print(f"{'probe':70s} {'µs':>8s} {'GB/s':>7s}")

    def report(label: str, nbytes: int, call) -> None:
        ms = time_calls(call, warmup=3, reps=args.repeats).median_ms
        print(f"{label:70s} {ms * 1e3:8.1f} {nbytes / ms / 1e6:7.0f}")

    # torch's kernels first, then the probes in order (the bulk ones, the newest code, last).
    # One round of the copies for every probe (Rotation): none starts on those just read.
    turn = Rotation(range(sets))
    halves = [d[:total].view(torch.float16) for d in data]
    report(
        "torch: sum of fp16 (reads only)",
        total,
        lambda i: halves[turn.take()].sum(dtype=torch.float32),
    )
    dst = torch.empty_like(halves[0])
    report(
        "torch: copy (reads, and writes as much)",
        2 * total,
        lambda i: dst.copy_(halves[turn.take()]),
    )
    for probe in found:
        out = torch.empty(probe.blocks * probe.threads, dtype=torch.int32, device=device)
        report(
            probe.label(), probe.read_bytes, lambda i, p=probe, o=out: p.run(data[turn.take()], o)
        )
    return 0


if __name__ == "__main__":
    run_script(main)
