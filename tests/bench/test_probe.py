"""The read-bandwidth probe (spio/src/read_probe.cu, scripts/read_probe.py): every mode reads
exactly its blocks' regions (checked through the per-thread XORs, emulated here and on a GPU
under `cuda`), builds for every arch without spills, and rejects bad shapes by name."""

import numpy as np
import pytest
import torch

import spio
from spio.bench.probe import Probe
from tests.conftest import load_script

CASES = [
    Probe("ldg", 3, 64, 4, 4096, 8192),
    Probe("ldg", 2, 32, 1, 1040, 1056),  # chunks not a multiple of the threads
    Probe("cp.async", 3, 64, 3, 4096, 8192),
    Probe("cp.async", 2, 32, 2, 1040, 1056),
    Probe("rows", 3, 64, 3, 4096, 8192, row_bytes=1024),
    Probe("rows", 2, 32, 4, 4800, 4800, row_bytes=480),  # more row buffers than rows in flight
    Probe("rows", 2, 64, 4, 3264, 3264, row_bytes=1088),  # 68 chunks a row: some threads copy 2
    Probe("rows", 2, 64, 4, 3264, 3264, row_bytes=1088, groups=4),  # staged as the convolutions
    Probe("rows", 3, 32, 2, 4096, 8192, row_bytes=1024, groups=8),  # an even pixel count, padded
    Probe("bulk", 3, 64, 3, 4096, 8192, row_bytes=512),
    Probe("bulk", 2, 32, 4, 1440, 1440, row_bytes=480),  # more buffers than rows
]


def _expected_xors(probe, data):
    """The per-block XOR of all 32-bit words each block reads, computed on the host."""
    words = data.cpu().numpy().view(np.uint32)
    out = []
    for b in range(probe.blocks):
        start = b * probe.region_stride // 4
        out.append(int(np.bitwise_xor.reduce(words[start : start + probe.region_bytes // 4])))
    return out


def _block_xors(out, probe):
    words = out.cpu().numpy().view(np.uint32).reshape(probe.blocks, probe.threads)
    return [int(np.bitwise_xor.reduce(row)) for row in words]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize(
    "probe", CASES, ids=lambda p: f"{p.mode}-d{p.depth}-r{p.region_bytes}-g{p.groups}"
)
def test_each_block_reads_exactly_its_region(probe, device):
    if device == "cuda" and probe.mode == "bulk" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("bulk copies need sm_90")
    gen = torch.Generator().manual_seed(probe.depth)
    data = torch.randint(0, 256, (probe.span_bytes + 64,), dtype=torch.uint8, generator=gen)
    out = torch.full((probe.blocks * probe.threads,), 7, dtype=torch.int32)
    got = probe.run(data.to(device), out.to(device))
    assert _block_xors(got, probe) == _expected_xors(probe, data)
    assert len(set(_expected_xors(probe, data))) == probe.blocks  # the regions differ


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_script_probes_build_without_spills(arch):
    from spio.compiler import compile_many

    script = load_script("read_probe")
    found = script.probes(64 << 20, 132, arch)
    modes = {"ldg", "cp.async", "rows"} | ({"bulk"} if arch == "sm_90" else set())
    assert {p.mode for p in found} == modes
    assert all(p.read_bytes > 63 << 20 for p in found)
    kernels = [p.kernel() for p in found]
    results = compile_many([k.compile_job(arch) for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), (kernel.name, result)
        assert not result.resources[kernel.entry].spills, kernel.name


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(mode="tma"), "mode must be one of"),
        (dict(threads=48), "threads a multiple of 32"),
        (dict(mode="rows", row_bytes=1000), "row_bytes a multiple of 16 dividing"),
        (dict(mode="bulk", row_bytes=0), "mode bulk needs row_bytes a multiple of 16"),
        (dict(region_bytes=1000), "multiples of 16"),
        (dict(mode="cp.async", depth=1), "needs depth >= 2"),
        (dict(groups=8), "groups need mode rows"),
        (dict(mode="rows", row_bytes=1024, groups=3), "that they divide, got 3 groups"),
        (dict(mode="rows", row_bytes=1024, groups=-8), "got -8 groups"),
    ],
)
def test_bad_probes_are_rejected(kwargs, message):
    base = dict(mode="ldg", blocks=2, threads=32, depth=2, region_bytes=4096, region_stride=4096)
    with pytest.raises(ValueError, match=message):
        Probe(**{**base, **kwargs})
    probe = Probe(**base)
    with pytest.raises(ValueError, match="aligned uint8 tensor of at least 8192 bytes"):
        probe.run(torch.zeros(100, dtype=torch.uint8))


def test_script_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    script = load_script("read_probe")
    assert script.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(blocks=0), "blocks >= 1, got 0"),
        (dict(depth=0), "depth >= 1, got 0"),
        (dict(threads=0), "threads >= 1, got 0"),
        (dict(threads=1056), "threads a multiple of 32 up to 1024, got 1056"),
        (dict(mode="bulk", row_bytes=1 << 20, region_bytes=1 << 20), "rows under 1 MiB"),
        (dict(blocks=2, region_bytes=1 << 30, region_stride=1 << 30), "at most 2 GiB"),
    ],
)
def test_probes_at_a_limit_are_rejected(kwargs, message):
    base = dict(mode="ldg", blocks=2, threads=32, depth=2, region_bytes=4096, region_stride=4096)
    with pytest.raises(ValueError, match=message):
        Probe(**{**base, **kwargs})


def test_probes_just_inside_the_limits_are_accepted():
    assert Probe("ldg", 1, 1024, 1, 16, 16).threads == 1024
    assert Probe("bulk", 1, 32, 2, (1 << 20) - 16, 1 << 20, row_bytes=(1 << 20) - 16).row_bytes
    assert Probe("ldg", 2, 32, 1, (1 << 30) - 16, 1 << 30).span_bytes == 2**31 - 16


def test_probe_sizes_count_regions_not_strides():
    """Block b reads region_bytes at b * region_stride: span to the last region's end, bytes
    read by all blocks, and shared memory per mode (bulk adds an 8-byte mbarrier per row)."""
    probe = Probe("ldg", 3, 64, 4, 4096, 8192)
    assert (probe.span_bytes, probe.read_bytes, probe.shared_mem_bytes) == (20480, 12288, 0)
    assert Probe("cp.async", 3, 64, 3, 4096, 8192).shared_mem_bytes == 3 * 64 * 16
    assert Probe("rows", 3, 64, 3, 4096, 8192, row_bytes=1024).shared_mem_bytes == 3 * 1024
    # 64 chunks a row as 8 groups of 8 pixels, each run padded to 9 chunks
    grouped = Probe("rows", 3, 64, 3, 4096, 8192, row_bytes=1024, groups=8)
    assert grouped.shared_mem_bytes == 3 * 8 * 9 * 16
    assert Probe("rows", 3, 64, 3, 4096, 8192, row_bytes=1024, groups=16).stage_chunks == 16 * 5
    assert Probe("bulk", 3, 64, 3, 4096, 8192, row_bytes=512).shared_mem_bytes == 3 * 520


def test_probe_refuses_data_that_is_not_16_byte_aligned():
    probe = Probe("ldg", 1, 32, 1, 64, 64)
    data = torch.zeros(256, dtype=torch.uint8)[1:]
    with pytest.raises(ValueError, match=f"16-byte aligned .* at {data.data_ptr():#x}"):
        probe.run(data)


def test_every_probe_field_gives_its_kernel_another_name():
    """spio keeps a loaded kernel under its name: probes differing only in one field must not
    share one."""
    base = Probe("rows", 2, 64, 2, 4096, 8192, row_bytes=1024)
    others = [
        Probe("bulk", 2, 64, 2, 4096, 8192, row_bytes=1024),
        Probe("rows", 3, 64, 2, 4096, 8192, row_bytes=1024),
        Probe("rows", 2, 32, 2, 4096, 8192, row_bytes=1024),
        Probe("rows", 2, 64, 4, 4096, 8192, row_bytes=1024),
        Probe("rows", 2, 64, 2, 2048, 8192, row_bytes=1024),
        Probe("rows", 2, 64, 2, 4096, 4096, row_bytes=1024),
        Probe("rows", 2, 64, 2, 4096, 8192, row_bytes=512),
        Probe("rows", 2, 64, 2, 4096, 8192, row_bytes=1024, groups=8),
    ]
    names = [p.kernel().name for p in [base, *others]]
    assert len(set(names)) == len(names), names


@pytest.mark.parametrize(
    "out",
    [torch.zeros(63, dtype=torch.int32), torch.zeros(64, dtype=torch.int64)],
    ids=["short", "int64"],
)
def test_probe_refuses_an_out_the_kernel_would_write_past(out):
    """One int32 a thread: a shorter or wider-typed buffer would be written past its end."""
    probe = Probe("ldg", 2, 32, 1, 64, 64)
    data = torch.zeros(256, dtype=torch.uint8)
    with pytest.raises(ValueError, match="int32 tensor of at least 64 elements"):
        probe.run(data, out)
