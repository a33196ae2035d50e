"""Each emulated primitive against a torch reference on random data."""

import platform

import pytest
import torch

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def bits(t: torch.Tensor) -> torch.Tensor:
    """16-bit float tensor -> its bits as int16 (the kernels take unsigned short)."""
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("k", [8, 16])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_mma_matches_matmul(prims_and_gpu, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(16, k, generator=gen).to(DTYPES[dtype])
    b = torch.randn(k, 8, generator=gen).to(DTYPES[dtype])
    c = torch.randn(16, 8, generator=gen)
    d = torch.full((16, 8), float("nan"))
    fn = prims_and_gpu.get_function(f"mma_k{k}_{dtype}")
    fn.launch(1, 32, (d, bits(a), bits(b.t()), c))
    ref = a.double() @ b.double() + c.double()
    torch.testing.assert_close(d.double(), ref, rtol=1e-6, atol=1e-5 * k)


def _normal_or_special_bits(shape, dtype, gen) -> torch.Tensor:
    """Random 16-bit patterns of `dtype` (normals, zeros, infinities, NaNs) with the subnormals,
    whose handling by mma the PTX ISA leaves unspecified, replaced by zero."""
    raw = torch.randint(0, 2**16, shape, generator=gen, dtype=torch.int32)
    exp_mask = 0x7C00 if dtype == "f16" else 0x7F80
    raw[(raw & exp_mask) == 0] = 0
    return raw.to(torch.int16)


def _mma_picking_columns(prims, k, dtype, a, gen):
    """D = A B + 0 on the kernel (A: 16 x k bit patterns), B picking a random column of A for
    each of its 8 columns: each element of D is one of A's times 1, exact whatever the order of
    accumulation. -> (D, B); D's elements not written stay 123."""
    b = torch.zeros(k, 8, dtype=DTYPES[dtype])
    b[torch.randperm(k, generator=gen)[:8], torch.arange(8)] = 1
    d = torch.full((16, 8), 123.0)
    prims.get_function(f"mma_k{k}_{dtype}").launch(1, 32, (d, a, bits(b.t()), torch.zeros(16, 8)))
    return d, b


@pytest.mark.parametrize("k", [8, 16])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_takes_every_finite_and_special_value_exactly(prims_and_gpu, k, dtype):
    """B selects one element of each A row per column (D = A[:, perm] exactly, whatever the
    accumulation order): the whole range of each type, the top f16 binade, infinities and NaNs
    (an infinity times B's zeros gives NaN across its row, as IEEE arithmetic does)."""
    gen = torch.Generator().manual_seed(9)
    a = _normal_or_special_bits((16, k), dtype, gen)
    if dtype == "f16":
        top = [0x7BFF, 0xF800, 0x7880, 0x7000, 0x3C00, 0xFBFF, 0x7A00, 0x0400]  # 65504, -32768..
        a[0, :8] = torch.tensor(top, dtype=torch.int32).to(torch.int16)
        a[1, :] = 0x3C00
        a[1, 3] = 0x7E00  # NaN
    d, b = _mma_picking_columns(prims_and_gpu, k, dtype, a, gen)
    ref = a.view(DTYPES[dtype]).double() @ b.double()
    torch.testing.assert_close(d.double(), ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("k", [8, 16])
def test_mma_keeps_f16_subnormal_inputs(prims_and_gpu, k):
    """The emulator multiplies f16 subnormals (below 2**-14) as they are; the PTX ISA leaves
    their handling open, so the GPU twin checks the GPU does the same: an emulated kernel test
    whose random weights hold one passes on that. Each product is exact in fp32. (bf16
    subnormals, below 1e-38, are fp32 subnormals too, and never met in practice.)"""
    gen = torch.Generator().manual_seed(11)
    sign = torch.randint(0, 2, (16, k), generator=gen) << 15
    a = (torch.randint(1, 0x400, (16, k), generator=gen) | sign).to(torch.int16)
    d, b = _mma_picking_columns(prims_and_gpu, k, "f16", a, gen)
    ref = a.view(torch.float16).double() @ b.double()
    assert (ref != 0).all() and (ref.abs() < 2.0**-14).all()
    torch.testing.assert_close(d.double(), ref, rtol=0, atol=0)


def _ldm_reference(m: torch.Tensor, n: int, trans: bool) -> torch.Tensor:
    """Registers each lane receives, from the PTX ISA ldmatrix fragment layout."""
    out = torch.zeros(32, 4, dtype=torch.int64)
    for lane in range(32):
        for j in range(n):
            if trans:
                lo, hi = m[j, 2 * (lane % 4), lane >> 2], m[j, 2 * (lane % 4) + 1, lane >> 2]
            else:
                lo, hi = m[j, lane >> 2, 2 * (lane % 4)], m[j, lane >> 2, 2 * (lane % 4) + 1]
            out[lane, j] = (int(lo) & 0xFFFF) | ((int(hi) & 0xFFFF) << 16)
    return out


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_fragment_layout(prims_and_gpu, n, trans):
    m = torch.randint(-(2**15), 2**15, (4, 8, 8), dtype=torch.int16)
    out = torch.full((32, 4), -1, dtype=torch.int32)
    name = f"ldm_x{n}" + ("_trans" if trans else "")
    prims_and_gpu.get_function(name).launch(1, 32, (out, m))
    got = out.to(torch.int64) & 0xFFFFFFFF
    ref = _ldm_reference(m, n, trans)
    assert torch.equal(got[:, :n], ref[:, :n])
    assert torch.equal(got[:, n:], torch.zeros_like(got[:, n:]))


def test_ldmatrix_feeds_mma_k16(prims_and_gpu):
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(16, 16, generator=gen).half()
    b = torch.randn(16, 8, generator=gen).half()
    d = torch.full((16, 8), float("nan"))
    prims_and_gpu.get_function("ldm_mma_k16").launch(1, 32, (d, bits(a), bits(b)))
    torch.testing.assert_close(d.double(), a.double() @ b.double(), rtol=1e-6, atol=1e-4)


def test_cp_async_partial_zero_fill(prims_and_gpu):
    n = 100
    gen = torch.Generator().manual_seed(4)
    src = torch.randint(1, 256, (n * 16,), dtype=torch.uint8, generator=gen)
    src_bytes = torch.randint(0, 17, (n,), dtype=torch.int32, generator=gen)
    out = torch.zeros(n * 16, dtype=torch.uint8)
    prims_and_gpu.get_function("cp_async_fill").launch(1, 128, (out, src, src_bytes, n))
    ref = src.view(n, 16).clone()
    keep = torch.arange(16)[None, :] < src_bytes[:, None]
    ref[~keep] = 0
    assert torch.equal(out.view(n, 16), ref)


def test_a_zero_byte_copy_must_still_name_an_address_inside_a_tensor(prims):
    """The kernels give a zero-filling copy an in-bounds fallback address; a copy whose address
    lies outside every tensor is reported even though it reads nothing."""
    from spio.emulator import EmulatorError

    src = torch.ones(3 * 16, dtype=torch.uint8)  # chunk 3 starts at its end (64-byte aligned)
    src_bytes = torch.tensor([16, 16, 16, 0], dtype=torch.int32)
    out = torch.zeros(4 * 16, dtype=torch.uint8)
    with pytest.raises(EmulatorError, match="zero-fills from 0x[0-9a-f]+, outside every tensor"):
        prims.get_function("cp_async_fill").launch(1, 128, (out, src, src_bytes, 4))


def test_cp_async_copies_the_bytes_named_from_any_16_byte_aligned_source(prims_and_gpu):
    src = torch.randn(6)
    out = torch.full((4,), float("nan"))
    prims_and_gpu.get_function("cp_async_at").launch(1, 1, (out, src, 4, 8))
    assert torch.equal(out, torch.cat([src[4:], torch.zeros(2)]))


def test_cp_async_source_must_be_16_byte_aligned(prims):
    from spio.emulator import EmulatorError

    with pytest.raises(EmulatorError, match="cp_async_16 source 0x[0-9a-f]+ is not 16-byte"):
        prims.get_function("cp_async_at").launch(1, 1, (torch.zeros(4), torch.randn(16), 1, 16))


def test_cp_async_reading_past_the_end_of_a_tensor_is_reported(prims):
    """All src_bytes bytes are checked, not the first: 16 bytes from the last 8 of a tensor."""
    from spio.emulator import EmulatorError

    with pytest.raises(EmulatorError, match="cp_async_16 reads 16 bytes at"):
        prims.get_function("cp_async_at").launch(1, 1, (torch.zeros(4), torch.randn(6), 4, 16))


def test_wait_group_does_not_wait_for_copies_left_out_of_every_group(prims):
    """PTX: wait_group waits for committed groups only; a copy issued after the last commit is
    in no group and may still be in flight (wait_all, unlike wait_group 0, commits first)."""
    from spio.emulator import EmulatorError

    src = torch.randn(128)
    fn = prims.get_function("cp_async_uncommitted")
    out = torch.zeros(128)
    fn.launch(1, 32, (out, src, 1))
    assert torch.equal(out, src)
    fn.launch(1, 32, (out, src, 0), check=False)
    assert torch.isnan(out).all()
    with pytest.raises(EmulatorError, match="before a cp_async_wait_group/cp_async_wait_all"):
        fn.launch(1, 32, (out, src, 0))


def test_cp_async_copy_happens_at_the_covering_wait(prims):
    src = torch.randn(256)
    out = torch.zeros(32, 12)
    # Unchecked: reading the second group's destination before its wait sees the NaN poison.
    prims.get_function("cp_async_groups").launch(1, 32, (out, src), check=False)
    assert torch.equal(out[:, 0:4], src[:128].view(32, 4))
    assert torch.isnan(out[:, 4:8]).all()
    assert torch.equal(out[:, 8:12], src[128:].view(32, 4))


def test_cp_async_stale_read_is_reported_when_checked(prims):
    from spio.emulator import EmulatorError

    with pytest.raises(EmulatorError, match="cp.async"):
        prims.get_function("cp_async_groups").launch(1, 32, (torch.zeros(32, 12), torch.randn(256)))


def _shfl_src(lane: int, mode: str, b: int, width: int) -> int:
    """The lane a shuffle reads, by the PTX ISA's shfl.sync: b counts modulo 32, a source past the
    end of the lane's segment (or before its start, for up) gives the lane its own value; an xor
    may reach into an earlier segment, never a later one."""
    b %= 32
    base = lane - lane % width
    if mode == "idx":
        return base + b % width
    if mode == "up":
        return lane - b if lane % width >= b else lane
    if mode == "down":
        return lane + b if lane % width + b < width else lane
    return lane ^ b if lane ^ b < base + width else lane


@pytest.mark.parametrize(
    "width,delta",
    [(32, 1), (32, 5), (16, 3), (8, 2), (4, 1), (16, 16), (8, 12), (4, 6), (2, 3), (1, 1)]
    + [(32, 33), (16, 37)],
)
def test_shuffles(prims_and_gpu, width, delta):
    vals = torch.randint(-1000, 1000, (32,), dtype=torch.int32)
    out = torch.zeros(32, 4, dtype=torch.int32)
    prims_and_gpu.get_function("shuffles").launch(1, 32, (out, vals, width, delta))
    for lane in range(32):
        srcs = [
            _shfl_src(lane, "idx", (lane * 7 + delta) & 31, width),
            _shfl_src(lane, "up", delta, width),
            _shfl_src(lane, "down", delta, width),
            _shfl_src(lane, "xor", delta, width),
        ]
        assert out[lane].tolist() == [int(vals[s]) for s in srcs], f"lane {lane}"


def test_shuffles_move_all_8_bytes_of_wide_values(prims_and_gpu):
    ints = torch.randint(-(2**62), 2**62, (32,), dtype=torch.int64)
    doubles = torch.randn(32, dtype=torch.float64) * 1e200
    out, dout = torch.zeros(32, dtype=torch.int64), torch.zeros(32, dtype=torch.float64)
    prims_and_gpu.get_function("shuffle_wide").launch(1, 32, (out, ints, dout, doubles))
    lanes = torch.arange(32)
    assert torch.equal(out, ints[lanes ^ 5])
    assert torch.equal(dout, doubles[(lanes * 3) & 31])


def test_activemask_leaves_out_exited_lanes(prims):
    """In index order lanes 0..11 have exited before the others ask."""
    out = torch.zeros(32, dtype=torch.int32)
    prims.get_function("active_lanes").launch(1, 32, (out, 12), seed=None)
    assert (out[12:].to(torch.int64) & 0xFFFFFFFF).tolist() == [0xFFFFF000] * 20


def test_atomics_of_each_kind_return_the_old_value(prims_and_gpu):
    iv = torch.tensor([-3, 4, -2, 4, 4], dtype=torch.int32)
    uv = torch.tensor([100, 3, 5, 6], dtype=torch.int32)
    lv = torch.tensor([2**41 + 7], dtype=torch.int64)
    dv = torch.tensor([1.0 + 2.0**-40], dtype=torch.float64)
    old = torch.zeros(10, dtype=torch.int64)
    dold = torch.zeros(1, dtype=torch.float64)
    prims_and_gpu.get_function("atomic_kinds").launch(1, 1, (iv, uv, lv, dv, old, dold))
    assert old.tolist() == [-3, 4, -2, 4, 4, 100, 3, 5, 6, 2**41 + 7]
    assert iv.tolist() == [2, 7, -2, -9, 4]
    assert (uv.to(torch.int64) & 0xFFFFFFFF).tolist() == [(100 + 0xFFFFFFF0) % 2**32, 77, 9, 6]
    assert lv.tolist() == [2**41 + 2**40 + 7]
    assert dold.tolist() == [1.0 + 2.0**-40] and dv.tolist() == [1.25 + 2.0**-40]


def test_shuffle_xor_reduction(prims_and_gpu):
    vals = torch.randn(32)
    out = torch.zeros(32)
    prims_and_gpu.get_function("shuffle_float").launch(1, 32, (out, vals))
    torch.testing.assert_close(out.double(), vals.double().sum().expand(32), rtol=1e-5, atol=1e-5)


def test_atomic_add_float(prims_and_gpu):
    n = 1000
    gen = torch.Generator().manual_seed(5)
    index = torch.randint(0, 37, (n,), dtype=torch.int32, generator=gen)
    value = torch.randn(n, generator=gen)
    out = torch.zeros(37)
    prims_and_gpu.get_function("atomic_scatter").launch(8, 128, (out, index, value, n), seed=11)
    ref = torch.zeros(37, dtype=torch.float64).index_add_(0, index.long(), value.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_dynamic_shared_memory(prims_and_gpu):
    x = torch.randn(96)
    out = torch.zeros(96)
    prims_and_gpu.get_function("dynamic_shared").launch(
        1, 96, (out, x, 96), shared_mem_bytes=96 * 4
    )
    torch.testing.assert_close(out, (x * 2).flip(0))


def _ticket_order(prims, seed, grid=8, block=64):
    order = torch.full((grid * block,), -1, dtype=torch.int32)
    counter = torch.zeros(1, dtype=torch.int32)
    prims.get_function("ticket").launch(grid, block, (order, counter), check=False, seed=seed)
    assert sorted(order.tolist()) == list(range(grid * block))
    return order


def test_seed_shuffles_block_and_thread_order_reproducibly(prims):
    """Without a seed blocks and threads run in index order; a seed gives another order of both,
    the same on every launch with that seed, and another seed yet another."""
    assert _ticket_order(prims, None).tolist() == list(range(8 * 64))
    first = _ticket_order(prims, 1)
    assert torch.equal(first, _ticket_order(prims, 1))
    assert not torch.equal(first, _ticket_order(prims, 2))
    per_block = first.view(8, 64)
    block_order = per_block.min(dim=1).values.argsort()
    assert block_order.tolist() != list(range(8))  # blocks out of index order
    # Blocks run whole, one at a time; the threads of each ran out of index order.
    assert torch.equal(
        per_block.max(dim=1).values - per_block.min(dim=1).values, torch.full((8,), 63)
    )
    assert all(row.tolist() != sorted(row.tolist()) for row in per_block)


def test_thread_order_shuffle_gives_same_result(prims):
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(16, 16, generator=gen).half()
    b = torch.randn(16, 8, generator=gen).half()
    results = []
    for seed in (None, 1, 2):
        d = torch.full((16, 8), float("nan"))
        prims.get_function("ldm_mma_k16").launch(1, 32, (d, bits(a), bits(b)), seed=seed)
        results.append(d)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_ucontext_fallback_runs_the_same_kernel(monkeypatch, emu_sources):
    """The portable glibc-ucontext fibers (used on non-x86-64 CPUs) give the same results."""
    from spio.emulator import load_module

    monkeypatch.setenv("SPIO_EMU_UCONTEXT", "1")
    module = load_module(emu_sources["primitives"], name="emu_test_ucontext")
    assert module.fiber_switch() == module.fiber_switch(checked=False) == "ucontext"
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(16, 16, generator=gen).half()
    b = torch.randn(16, 8, generator=gen).half()
    d = torch.full((16, 8), float("nan"))
    module.get_function("ldm_mma_k16").launch(1, 32, (d, bits(a), bits(b)), seed=3)
    torch.testing.assert_close(d.double(), a.double() @ b.double(), rtol=1e-6, atol=1e-4)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the assembly switch is x86-64 only")
def test_x86_64_builds_use_the_assembly_fiber_switch(emu_sources, monkeypatch):
    """Without SPIO_EMU_UCONTEXT an x86-64 build switches fibers in assembly, with no system
    call per switch (from the first session to the ninth, a wrong #if built ucontext anyway)."""
    from spio.emulator import load_module

    monkeypatch.delenv("SPIO_EMU_UCONTEXT", raising=False)
    module = load_module(emu_sources["primitives"], name="emu_test_asm_switch")
    assert module.fiber_switch() == module.fiber_switch(checked=False) == "asm"


@pytest.mark.parametrize("n", [0, 1, 2, 3, 6])
@pytest.mark.parametrize("empties", [0, 2])
def test_wait_group_n_lands_exactly_the_groups_older_than_the_newest_n(prims, n, empties):
    """PTX cp.async.wait_group N: the thread waits until only N or fewer of its most recent groups
    are pending and all earlier ones are complete; an empty group is trivially complete but is
    still a group (it counts among the N newest). After 8 one-copy groups and `empties` empty
    ones, wait_group<N> must have landed exactly groups 0 .. 8 + empties - N - 1 (the emulator
    lands a copy at the latest legal moment, so the rest still hold the poison). The reference is
    the ISA sentence, not the runtime's counter arithmetic: the kernels wait with N up to 6
    (STAGES - 2 with 8 stages) and rely on empty tail groups."""
    src = torch.randn(8 * 32 * 4)
    out = torch.zeros(8 * 32 * 4)
    prims.get_function(f"cp_async_wait_n{n}").launch(1, 32, (out, src, empties), check=False)
    landed = max(0, min(8, 8 + empties - n))
    chunks, expected = out.view(8, 32, 4), src.view(8, 32, 4)
    assert torch.equal(chunks[:landed], expected[:landed])
    assert torch.isnan(chunks[landed:]).all()


def test_predicated_off_copy_writes_nothing(prims_and_gpu):
    """`@p cp.async` with p false is not executed: no bytes copied and no zero-fill (unlike
    src-size 0, which zero-fills all 16 bytes). Mixed with enabled copies of every src_bytes."""
    gen = torch.Generator().manual_seed(12)
    src = torch.randint(1, 256, (64 * 16,), dtype=torch.uint8, generator=gen)
    enable = torch.randint(0, 2, (64,), dtype=torch.int32, generator=gen)
    src_bytes = torch.randint(0, 17, (64,), dtype=torch.int32, generator=gen)
    enable[:2] = torch.tensor([0, 0], dtype=torch.int32)
    src_bytes[:2] = torch.tensor([0, 16], dtype=torch.int32)  # disabled zero-fill, disabled copy
    out = torch.zeros(64 * 16, dtype=torch.uint8)
    prims_and_gpu.get_function("cp_async_if_fill").launch(1, 64, (out, src, enable, src_bytes))
    ref = src.view(64, 16).clone()
    ref[torch.arange(16)[None, :] >= src_bytes[:, None]] = 0
    ref[enable == 0] = 0xA5
    assert torch.equal(out.view(64, 16), ref)
