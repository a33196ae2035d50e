"""sm_90 bulk tensor copies (cp_async_bulk_tensor_4d_g2s, TMA) in the emulator, and kernel
parameters passed by value as a struct (a `const __grid_constant__ spio::TensorMap`).

A tensor copy lands a box of a tensor in shared memory in one instruction: zeros where the box
lies outside the tensor (negative coordinates included), every byte counted on the mbarrier, and,
with a swizzle of S bytes, each 16-byte chunk moved by XORing its address bits [4, 4 + log2(S/16))
with bits [7, ...). The references here compute the box with torch indexing and the swizzle with
CUTLASS's formulation (Swizzle<B, 4, 3>: offset ^ ((offset & mask << 7) >> 3)), not the runtime's.
"""

import pytest
import torch

from spio.cuda.tensor_map import TensorMap
from spio.emulator import EmulatorError
from tests.emulator.conftest import COMPILERS, load

TENSOR_COPY = r"""
#include "spio/thread/bulk_copy.h"

/// Thread 0 announces `expect` bytes on an mbarrier and copies the box of `map` at (c0, c1, c2,
/// c3) to dynamic shared memory + `offset` bytes; every thread waits, then out[0..bytes/2) gets
/// the shared memory's 16-bit words from dst and where[0] the dynamic buffer's address mod 1024.
/// `src` is the tensor the map describes (an argument, as on a GPU, so that the emulator knows
/// its bounds); the map comes before it, as a kernel may take them. `bug`: 0 none, 1 thread 0
/// reads dst before its wait, 2 the map pointer is 8 bytes off, 3 thread 0 issues the copy
/// twice before the wait, 4 thread 0 overwrites src[poke] while the copy is in flight; 5 to 8:
/// after every thread has read dst, a __syncthreads(), then thread 0 copies the box into dst
/// again, and out gets it once more: 5 with no fence_proxy_async_shared() before the copy; 6
/// with thread 0's fence before the barrier; 7 with no fence and the threads writing dst before
/// the barrier; 8 as spio/thread/bulk_copy.h has it (thread 0 fences after the barrier).
extern "C" __global__ void box4(unsigned short *out, const __grid_constant__ spio::TensorMap map,
                                unsigned short *src, int c0, int c1, int c2, int c3, int bytes,
                                int expect, int offset, int bug, int poke,
                                unsigned long long *where) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    unsigned char *dst = smem + offset;
    if (threadIdx.x == 0) {
        spio::mbarrier_init(&bar, 1);
        spio::fence_mbarrier_init();
        where[0] = reinterpret_cast<unsigned long long>(smem) % 1024;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const spio::TensorMap *m = &map;
        if (bug == 2) {
            m = reinterpret_cast<const spio::TensorMap *>(reinterpret_cast<const char *>(&map) + 8);
        }
        spio::mbarrier_arrive_expect_tx(&bar, expect);
        spio::cp_async_bulk_tensor_4d_g2s(dst, m, c0, c1, c2, c3, &bar);
        if (bug == 3) spio::cp_async_bulk_tensor_4d_g2s(dst, m, c0, c1, c2, c3, &bar);
        if (bug == 1) out[0] = dst[0];
        if (bug == 4) src[poke] = 0;
    }
    spio::mbarrier_wait_parity(&bar, 0);
    unsigned short *words = reinterpret_cast<unsigned short *>(dst);
    for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) out[i] = words[i];
    if (bug >= 5) {
        if (bug == 7) {
            for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) words[i] = 0;
        }
        if (bug == 6 && threadIdx.x == 0) spio::fence_proxy_async_shared();
        __syncthreads();
        if (threadIdx.x == 0) {
            if (bug == 8) spio::fence_proxy_async_shared();
            spio::mbarrier_arrive_expect_tx(&bar, expect);
            spio::cp_async_bulk_tensor_4d_g2s(dst, &map, c0, c1, c2, c3, &bar);
        }
        spio::mbarrier_wait_parity(&bar, 1);
        for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) out[i] = words[i];
    }
}

/// A struct parameter of 12 bytes, returned field by field: out = {a, b, c}.
struct Triple {
    int a, b, c;
};
extern "C" __global__ void triple(int *out, const Triple t) {
    out[0] = t.a;
    out[1] = t.b;
    out[2] = t.c;
}
"""

SHARED_BYTES = 64 * 1024

BARRIER_BYTES = r"""
#include "spio/thread/bulk_copy.h"

/// An mbarrier at dynamic shared memory + 128; thread 0 then touches it: `mode` 1 a plain store to
/// one of its bytes, 2 a plain read, 3 a bulk copy of 256 bytes from `src` onto dyn[0..256),
/// 0 nothing. Every block first stores to those bytes before the barrier exists (allowed: they
/// are plain shared memory until mbarrier_init, in each block). Modes 4 to 7 leave out the
/// fence_mbarrier_init after the init: 4 thread 0 copies 256 bytes onto dyn[256..512) on the
/// barrier; 5 thread 1 waits on it, after the __syncthreads (fine: the CUDA Programming Guide's
/// pattern); 6 thread 0 arrives on it and waits; 7 thread 0 runs fence_proxy_async_shared
/// instead, then copies as in 4 (fine: the Guide's TMA examples).
extern "C" __global__ void barrier_bytes(int mode, const uint4 *src, unsigned char *out) {
    extern __shared__ __align__(1024) unsigned char dyn[];
    auto *bar = reinterpret_cast<unsigned long long *>(dyn + 128);
    if (threadIdx.x == 0) {
        dyn[130] = 7;
        spio::mbarrier_init(bar, 1);
        if (mode < 4) spio::fence_mbarrier_init();
        if (mode == 7) spio::fence_proxy_async_shared();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (mode == 1) dyn[130] = 1;
        if (mode == 2) out[0] = dyn[129];
        if (mode == 3 || mode == 4 || mode == 7) {
            spio::mbarrier_arrive_expect_tx(bar, 256);
            spio::cp_async_bulk_g2s(dyn + (mode == 3 ? 0 : 256), src, 256, bar);
            spio::mbarrier_wait_parity(bar, 0);
        }
        if (mode == 6) {
            spio::mbarrier_arrive_expect_tx(bar, 0);
            spio::mbarrier_wait_parity(bar, 0);
        }
    }
    if (mode == 5 && threadIdx.x == 1) spio::mbarrier_wait_parity(bar, 1);
}
"""


@pytest.fixture(scope="module", params=COMPILERS)
def tc(request):
    return load(TENSOR_COPY, "emu_test_tensor_copy", request.param)


def _nhwc(n, h, w, c, seed=0):
    """An [n][h][w][c] tensor of 16-bit values (fp16 bits as int16), none of them zero."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 2**15, (n, h, w, c), generator=gen, dtype=torch.int16)


def _box_reference(x, box, coords):
    """The box of x ([N][H][W][C]) at coords, both innermost first (c, w, h, n), as
    [box n][box h][box w][box c], zeros where the box lies outside x."""
    index = [torch.arange(b) + c for b, c in zip(box, coords, strict=True)]
    sizes = (x.shape[3], x.shape[2], x.shape[1], x.shape[0])
    inside = [(i >= 0) & (i < s) for i, s in zip(index, sizes, strict=True)]
    ic, iw, ih, in_ = (i.clamp(0, s - 1) for i, s in zip(index, sizes, strict=True))
    values = x[in_[:, None, None, None], ih[None, :, None, None], iw[None, None, :, None], ic]
    mask = inside[3][:, None, None, None] & inside[2][None, :, None, None]
    mask = mask & inside[1][None, None, :, None] & inside[0][None, None, None, :]
    return torch.where(mask, values, torch.zeros_like(values))


def _swizzled(landing, swizzle):
    """The 16-bit words of `landing` (flat, in landing order from a 1024-byte aligned dst) where a
    copy with `swizzle` puts them: CUTLASS's Swizzle<B, 4, 3> of each byte offset."""
    if swizzle == 0:
        return landing
    bits = {32: 1, 64: 2, 128: 3}[swizzle]
    mask = ((1 << bits) - 1) << 7
    byte = 2 * torch.arange(landing.numel())
    moved = byte ^ ((byte & mask) >> 3)
    out = torch.empty_like(landing)
    out[moved // 2] = landing
    return out


def _small_map(box: tuple[int, ...], swizzle: int = 0):
    """The 2x3x5x16 tensor most tests copy from (_nhwc), and the map of its `box` (c, w, h, n)."""
    x = _nhwc(2, 3, 5, 16)
    return x, TensorMap.of_tensor(x, (3, 2, 1, 0), box, swizzle=swizzle)


def _run(
    tc, x, tmap, coords, *, src=None, expect=None, offset=0, bug=0, poke=-1, check=True, moved=0,
    seed=None,
):  # fmt: skip
    """Launches box4; returns the landed words (flat) and the dynamic buffer's address mod 1024."""
    out = torch.full((tmap.box_bytes // 2,), -1, dtype=torch.int16)
    where = torch.full((1,), -1, dtype=torch.int64)
    args = (
        out,
        tmap.emulator_bytes(),
        x if src is None else src,
        *coords,
        tmap.box_bytes,
        tmap.box_bytes if expect is None else expect,
        offset,
        bug,
        poke,
        where,
    )
    tc.get_function("box4").launch(
        1, 64, args, shared_mem_bytes=SHARED_BYTES, check=check, shared_offset=moved, seed=seed
    )
    return out, int(where[0])


# (tensor [N, H, W, C], box (c, w, h, n), swizzle, coords (c, w, h, n)): boxes hanging off every
# side of the tensor, negative coordinates included, and boxes wholly inside or outside it.
CASES = [
    ((2, 3, 5, 16), (8, 6, 1, 1), 0, (-3, -2, 1, 0)),
    ((2, 3, 5, 16), (8, 6, 1, 1), 0, (12, 2, 2, 1)),
    ((2, 3, 5, 16), (8, 6, 1, 1), 0, (4, 0, 3, 1)),
    ((2, 3, 5, 16), (8, 6, 1, 1), 0, (0, 0, 0, -1)),
    ((2, 3, 5, 16), (8, 6, 1, 1), 0, (8, -1, -1, 2)),
    ((2, 3, 5, 16), (16, 5, 3, 2), 0, (0, 0, 0, 0)),
    ((2, 3, 5, 16), (16, 6, 2, 2), 32, (-5, -1, 2, -1)),
    ((2, 3, 5, 16), (16, 8, 4, 1), 32, (3, 0, -1, 1)),
    ((2, 3, 5, 48), (32, 6, 2, 2), 64, (-7, 1, -1, 1)),
    ((2, 3, 5, 48), (32, 8, 3, 1), 64, (40, -3, 0, 0)),
    ((2, 4, 5, 80), (64, 6, 3, 2), 128, (-9, -2, 2, -1)),
    ((2, 4, 5, 80), (64, 8, 4, 1), 128, (30, 0, 0, 1)),
]


@pytest.mark.parametrize("shape,box,swizzle,coords", CASES)
def test_box_copy_lands_the_box_with_zeros_outside_and_the_swizzle(tc, shape, box, swizzle, coords):
    x = _nhwc(*shape)
    tmap = TensorMap.of_tensor(x, (3, 2, 1, 0), box, swizzle=swizzle)
    got, aligned = _run(tc, x, tmap, coords)
    assert aligned == 0  # the dynamic buffer starts at a multiple of 1024 unless told otherwise
    want = _swizzled(_box_reference(x, box, coords).flatten(), swizzle)
    assert torch.equal(got, want)


def test_swizzle_moves_the_chunks(tc):
    """The 128-byte swizzle does move data (a reference that forgot it would differ)."""
    x = _nhwc(1, 1, 8, 64)
    tmap = TensorMap.of_tensor(x, (3, 2, 1, 0), (64, 8, 1, 1), swizzle=128)
    got, _ = _run(tc, x, tmap, (0, 0, 0, 0))
    plain = x.flatten()
    assert not torch.equal(got, plain)
    assert torch.equal(got.view(8, 8, 8)[3, 3 ^ 5], plain.view(8, 8, 8)[3, 5])  # row 3, chunk 5


def test_unchecked_launch_lands_the_same_box(tc):
    x = _nhwc(2, 3, 5, 48)
    box, coords = (32, 6, 2, 2), (-7, 1, -1, 1)
    tmap = TensorMap.of_tensor(x, (3, 2, 1, 0), box, swizzle=64)
    got, _ = _run(tc, x, tmap, coords, check=False)
    assert torch.equal(got, _swizzled(_box_reference(x, box, coords).flatten(), 64))


def test_a_map_of_a_view_inside_a_tensor_argument_reads_its_guarded_copy(tc):
    """Checked launches move tensor arguments into guarded copies; a map whose address lies inside
    one (here the second image of x, not x's first byte) is moved with it, so the copy reads the
    guarded copy (unmoved, it would read outside every tensor the launch knows)."""
    x = _nhwc(2, 3, 5, 16)
    tmap = TensorMap.of_tensor(x[1:], (3, 2, 1, 0), (16, 5, 3, 1))
    assert tmap.address == x.data_ptr() + x[0].numel() * 2
    got, _ = _run(tc, x, tmap, (0, 0, 0, 0))
    assert torch.equal(got, x[1].flatten())


def test_a_map_into_no_tensor_argument_is_an_out_of_bounds_read(tc):
    x, tmap = _small_map((8, 6, 1, 1))
    other = _nhwc(2, 3, 5, 16, seed=1)
    with pytest.raises(
        EmulatorError,
        match="out-of-bounds global-memory access: cp_async_bulk_tensor_4d_g2s reads 16 bytes at",
    ):
        _run(tc, x, tmap, (0, 0, 0, 0), src=other)


def test_a_box_past_the_tensor_is_reported_when_the_map_overstates_it(tc):
    """The map claims 4 rows of x's 3: the read of the fourth lies past x (in its guard zone)."""
    x = _nhwc(1, 3, 1, 16)
    tmap = TensorMap(x.data_ptr(), 2, (16, 1, 4, 1), (32, 32, 128), (16, 1, 4, 1))
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access"):
        _run(tc, x, tmap, (0, 0, 0, 0))


def test_zeros_count_as_transaction_bytes(tc):
    """A box wholly outside the tensor lands only zeros, and they complete the phase that
    announced the box's bytes (shared memory starts poisoned: 0xff bytes)."""
    x, tmap = _small_map((16, 4, 2, 1), swizzle=32)
    got, _ = _run(tc, x, tmap, (0, 0, 0, 5))
    assert torch.equal(got, torch.zeros_like(got))


@pytest.mark.parametrize(
    "extra,message",
    [
        (16, "mbarrier wait never ends: phase parity 0 .* 16 announced bytes not copied"),
        (-16, "moved 16 bytes more than mbarrier_arrive_expect_tx announced"),
    ],
    ids=["announced-too-many", "announced-too-few"],
)
def test_a_wrong_transaction_count_is_reported(tc, extra, message):
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(EmulatorError, match=message):
        _run(tc, x, tmap, (-3, -2, 1, 0), expect=tmap.box_bytes + extra)


def test_a_map_not_made_for_the_emulator_is_refused(tc):
    x = _nhwc(2, 3, 5, 16)
    out = torch.zeros(48, dtype=torch.int16)
    where = torch.zeros(1, dtype=torch.int64)
    args = (out, bytes(128), x, 0, 0, 0, 0, 96, 96, 0, 0, -1, where)
    with pytest.raises(
        EmulatorError,
        match=r"cp_async_bulk_tensor_4d_g2s: the map at 0x[0-9a-f]+ is not a tensor map made for "
        r"the emulator \(spio.cuda.tensor_map.TensorMap.emulator_bytes\): its first 8 bytes are 0,",
    ):
        tc.get_function("box4").launch(1, 64, args, shared_mem_bytes=SHARED_BYTES)


def test_a_map_of_another_rank_is_refused(tc):
    x = _nhwc(2, 3, 5, 16)
    tmap = TensorMap.of_tensor(x.view(6, 5, 16), (2, 1, 0), (8, 6, 1))
    with pytest.raises(EmulatorError, match="the tensor map has rank 3, but the copy gives 4"):
        _run(tc, x, tmap, (0, 0, 0, 0))


def test_a_misaligned_map_is_refused(tc):
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(
        EmulatorError, match=r"the tensor map at 0x[0-9a-f]+ is not 16-byte aligned"
    ):
        _run(tc, x, tmap, (0, 0, 0, 0), bug=2)


def test_a_destination_off_128_bytes_is_refused(tc):
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(
        EmulatorError,
        match=r"cp_async_bulk_tensor_4d_g2s destination: shared address 0x[0-9a-f]+ is not "
        r"128-byte aligned",
    ):
        _run(tc, x, tmap, (0, 0, 0, 0), offset=64)


def test_a_box_running_past_shared_memory_is_refused(tc):
    x, tmap = _small_map((8, 6, 2, 1))  # 192 bytes, 128 of them left
    with pytest.raises(
        EmulatorError,
        match=r"cp_async_bulk_tensor_4d_g2s destination: address 0x[0-9a-f]+ is not inside the "
        r"block's shared memory",
    ):
        _run(tc, x, tmap, (0, 0, 0, 0), offset=SHARED_BYTES - 128)


def test_a_destination_16_bytes_off_128_is_refused_too(tc):
    """A 1-D bulk copy needs 16-byte alignment; a tensor copy needs 128."""
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(EmulatorError, match="is not 128-byte aligned"):
        _run(tc, x, tmap, (0, 0, 0, 0), offset=16)


def test_a_swizzled_row_narrower_than_the_span_is_refused(tc):
    """The GPU takes a box inner dim below the swizzle span (the driver's rule), but pads its rows
    in a way spio does not rely on: the emulator refuses it and says so."""
    x, tmap = _small_map((16, 4, 1, 1), swizzle=64)
    with pytest.raises(
        EmulatorError,
        match=r"a 64-byte swizzle needs a box inner dim of exactly 64 bytes in the emulator, got "
        r"32 \(box dim 0 of 16 elements of 2 bytes\); the GPU accepts fewer, but then pads",
    ):
        _run(tc, x, tmap, (0, 0, 0, 0))


def test_reading_the_destination_before_the_wait_is_a_stale_read(tc):
    x, tmap = _small_map((8, 6, 1, 1), swizzle=0)
    with pytest.raises(
        EmulatorError,
        match=r"reads shared address 0x[0-9a-f]+, the destination of an async copy \(cp.async or "
        r"bulk\) issued by thread \(0,0,0\), before a cp_async_wait_group/cp_async_wait_all or "
        r"mbarrier wait covering it \(stale data\)",
    ):
        _run(tc, x, tmap, (0, 0, 0, 0), bug=1)


def test_a_copy_onto_one_in_flight_is_refused(tc):
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(
        EmulatorError,
        match=r"cp_async_bulk_tensor_4d_g2s to 0x[0-9a-f]+ overlaps an async copy that has not "
        r"landed",
    ):
        _run(tc, x, tmap, (0, 0, 0, 0), bug=3, expect=2 * tmap.box_bytes)


def test_overwriting_the_source_of_a_copy_in_flight_is_a_race(tc):
    x, tmap = _small_map((8, 6, 1, 1))
    poke = (1 * 3 + 2) * 5 * 16 + 3 * 16 + 5  # element (n 1, h 2, w 3, c 5): inside the box
    with pytest.raises(
        EmulatorError,
        match=r"global-memory race: writes address 0x[0-9a-f]+, which a "
        r"cp_async_bulk_tensor_4d_g2s to shared address 0x[0-9a-f]+ reads, before the phase",
    ):
        _run(tc, x, tmap, (2, 1, 2, 1), bug=4, poke=poke)


def test_overwriting_bytes_the_copy_does_not_read_is_no_race(tc):
    """The zeros of a box read nothing: a store next to the box's in-bounds part is fine."""
    x, tmap = _small_map((8, 6, 1, 1))
    poke = (1 * 3 + 2) * 5 * 16 + 3 * 16 + 1  # element (n 1, h 2, w 3, c 1): left of the box
    want = _box_reference(x.clone(), (8, 6, 1, 1), (2, 1, 2, 1)).flatten()
    got, _ = _run(tc, x, tmap, (2, 1, 2, 1), bug=4, poke=poke)
    assert torch.equal(got, want) and x.view(-1)[poke] == 0


@pytest.mark.parametrize(
    "bug, accessed",
    [
        (5, r"thread \([0-9]+,0,0\) read"),
        (6, r"thread \([1-9][0-9]*,0,0\) read"),
        (7, r"thread \([0-9]+,0,0\) wrote"),
    ],
)
@pytest.mark.parametrize("seed", [None, 3])
def test_a_refill_after_plain_accesses_needs_a_proxy_fence(tc, bug, accessed, seed):
    """A tensor copy into a buffer the threads have read (or written) writes through the async
    proxy, which their plain accesses are not ordered with unless a fence_proxy_async_shared()
    comes after them: the issuing thread's, after the barrier that follows the reads, or each
    writer's own (spio/thread/bulk_copy.h). Without it, or with the fence before the barrier, the
    emulator refuses the copy; with it, the box lands again."""
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(
        EmulatorError,
        match=r"thread \(0,0,0\): cp_async_bulk_tensor_4d_g2s issued by thread \(0,0,0\) writes "
        rf"shared address 0x[0-9a-f]+, which {accessed} with no fence_proxy_async_shared\(\) after",
    ):
        _run(tc, x, tmap, (2, 1, 2, 1), bug=bug, seed=seed)
    got, _ = _run(tc, x, tmap, (2, 1, 2, 1), bug=8, seed=seed)
    assert torch.equal(got, _box_reference(x.clone(), (8, 6, 1, 1), (2, 1, 2, 1)).flatten())


# Structs passed by value: a kernel's `const T` parameter of a trivially copyable class takes its
# bytes ("s<N>", N = sizeof(T)).


def test_struct_parameters_take_their_bytes(tc):
    import struct

    fn = tc.get_function("triple")
    for data in (
        struct.pack("<3i", 7, -8, 9),
        bytearray(struct.pack("<3i", 7, -8, 9)),
        memoryview(struct.pack("<3i", 7, -8, 9)),
    ):
        out = torch.zeros(3, dtype=torch.int32)
        fn.launch(1, 1, (out, data))
        assert out.tolist() == [7, -8, 9]


def test_a_struct_parameter_of_the_wrong_length_is_refused(tc):
    with pytest.raises(
        ValueError,
        match=r"argument 1 of kernel triple is a struct of 12 bytes \(s12\): got 11 bytes",
    ):
        tc.get_function("triple").launch(1, 1, (torch.zeros(3, dtype=torch.int32), bytes(11)))


@pytest.mark.parametrize("value", [12, torch.zeros(3, dtype=torch.int32), "abc"])
def test_a_struct_parameter_of_another_type_is_refused(tc, value):
    with pytest.raises(
        TypeError,
        match=r"argument 1 of kernel triple is a struct of 12 bytes \(s12\): pass bytes, "
        r"bytearray or memoryview, got",
    ):
        tc.get_function("triple").launch(1, 1, (torch.zeros(3, dtype=torch.int32), value))


def test_the_signature_names_struct_kinds(tc):
    loaded = tc._load(True)
    assert tc.get_function("triple")._signature(loaded) == ["p", "s12"]
    assert tc.get_function("box4")._signature(loaded)[:3] == ["p", "s128", "p"]


def _compile_for_sm_90(source: str, name: str):
    """`source` compiled by NVRTC for sm_90 (the test skipped where NVRTC is missing)."""
    compiler = pytest.importorskip("spio.compiler")
    try:
        from spio.cuda.paths import find_nvrtc

        find_nvrtc()
    except Exception as error:  # no NVRTC on this machine
        pytest.skip(f"NVRTC not available: {error}")
    return compiler.compile_cubin(source, "sm_90", name=name)


def test_tensor_copy_kernels_compile_with_nvrtc_for_sm_90():
    """The GPU branch of the tensor copy and the __grid_constant__ map parameter build too."""
    assert _compile_for_sm_90(TENSOR_COPY, "emu_tensor_copy.cu").cubin


def test_a_swizzled_destination_off_the_patterns_repeat_is_refused(tc):
    """The GPU swizzles by address bits: a box landing off the repeat (8 rows of the span) would
    be permuted unlike the layout spio's buffers expect, so the emulator refuses it."""
    x = _nhwc(1, 1, 8, 64)
    tmap = TensorMap.of_tensor(x, (3, 2, 1, 0), (64, 8, 1, 1), swizzle=128)
    with pytest.raises(
        EmulatorError,
        match=r"a 128-byte swizzle's destination must be aligned to its repeat, 1024 bytes \(8 "
        r"rows of its span\), for the box to land in the layout spio's buffers expect; got 0x",
    ):
        _run(tc, x, tmap, (0, 0, 0, 0), offset=128)
    y = _nhwc(1, 1, 8, 16)
    small = TensorMap.of_tensor(y, (3, 2, 1, 0), (16, 8, 1, 1), swizzle=32)
    got, _ = _run(tc, y, small, (0, 0, 0, 0), offset=256)  # 32 bytes: a repeat of 256
    assert torch.equal(got, _swizzled(y.flatten(), 32))


@pytest.mark.parametrize("moved", [16, 528, 1008])
def test_the_dynamic_buffer_can_start_off_a_1024_byte_boundary(tc, moved):
    """shared_offset starts the dynamic buffer that far past a 1024-byte boundary, as a GPU may
    (it promises 16 bytes): a kernel that does not align its buffer then meets the alignment
    rules (here: a tensor copy to the buffer's start is refused)."""
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(EmulatorError, match="is not 128-byte aligned"):
        _run(tc, x, tmap, (0, 0, 0, 0), moved=moved)
    if moved % 128 == 16:
        got, where = _run(tc, x, tmap, (0, 0, 0, 0), moved=moved, offset=128 - moved % 128)
        assert where == moved and torch.equal(
            got, _box_reference(x, (8, 6, 1, 1), (0,) * 4).flatten()
        )


@pytest.mark.parametrize("moved", [8, 1024, -16, 16.0])
def test_a_dynamic_buffer_offset_off_16_or_past_1008_is_refused(tc, moved):
    x, tmap = _small_map((8, 6, 1, 1))
    with pytest.raises(ValueError, match="shared_offset must be a multiple of 16 in 0..1008, got"):
        _run(tc, x, tmap, (0, 0, 0, 0), moved=moved)


@pytest.fixture(scope="module")
def barrier_kernel():
    return load(BARRIER_BYTES, "emu_test_barrier_bytes", COMPILERS[0]).get_function("barrier_bytes")


@pytest.mark.parametrize(
    "mode,message",
    [
        (1, r"thread \(0,0,0\): writes shared address 0x[0-9a-f]+, a byte of an mbarrier"),
        (2, r"reads shared address 0x[0-9a-f]+, a byte of an mbarrier \(mbarrier_init made it "
            r"one\): only the mbarrier operations may touch its 8 bytes"),
        (3, r"cp_async_bulk_g2s.* shared address 0x[0-9a-f]+, a byte of an mbarrier"),
        # Without a proxy fence after the init the copy engine may meet a barrier not yet
        # initialised for it (the emulator's fence_mbarrier_init had been a no-op).
        (4, r"thread \(0,0,0\): cp_async_bulk_g2s on the mbarrier at 0x[0-9a-f]+, whose "
            r"mbarrier_init \(by thread 0\) no fence_mbarrier_init or fence_proxy_async_shared "
            r"of that thread has made visible to the copy engine"),
    ],
)  # fmt: skip
def test_an_mbarriers_bytes_are_the_barriers_alone(barrier_kernel, mode, message):
    """On a GPU a plain access or a copy landing on an initialised mbarrier corrupts it (a wait
    that never ends, or one that ends early): the emulator refuses them. Before mbarrier_init,
    and in each new block, the bytes are plain shared memory (every block stores to them first,
    and two blocks run)."""
    src = torch.zeros(16, 4, dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.uint8)
    barrier_kernel.launch(2, 32, (0, src, out), shared_mem_bytes=1024)  # nothing wrong
    for fine in (5, 6, 7):  # another thread after the block barrier; its own; a proxy fence
        barrier_kernel.launch(2, 32, (fine, src, out), shared_mem_bytes=1024)
    with pytest.raises(EmulatorError, match=message):
        barrier_kernel.launch(2, 32, (mode, src, out), shared_mem_bytes=1024)


# Bulk tensor stores (cp_async_bulk_tensor_4d_s2g): the box goes back from shared memory, laid out
# as a tensor copy lands it (swizzle included), to the tensor, the elements outside the tensor
# left out. A store joins its thread's open bulk group and copies when that thread's
# cp_async_bulk_wait_group retires the group; until then its shared box must not be written and
# its global bytes must not be touched.

TENSOR_STORE = r"""
#include "spio/thread/bulk_copy.h"

/// Thread 0 stores the box of `dst_map` (the map of `dst`) at (c0, c1, c2, c3) from dynamic shared
/// memory + `offset`, which holds: `fill` 0, the `bytes` / 2 16-bit words of `words`, written by
/// every thread with plain stores; `fill` 1, the box of `src_map` (the map of `src`) at the same
/// coordinates, copied in by thread 0 with cp_async_bulk_tensor_4d_g2s; `fill` 2, what shared
/// memory starts with (no thread writes it). Thread 0 commits the
/// store's group and waits for it. `bug`: 0 none; 1 thread 1 overwrites the box's first word with
/// 0x7777 after the store's issue and before thread 0's wait (a __syncthreads on either side);
/// 2 no wait; 3 no commit (the wait has no group to wait for); 4 thread 0 reads dst[peek] into
/// words[0] before its wait; 5 thread 1 does after thread 0's wait, with no __syncthreads between
/// (but one between the store's issue and the wait); 6 thread 1 overwrites the box's first word
/// so; 7 (fill 1) thread 0 stores the box before waiting for it to land; 8 (fill 1) thread 0
/// copies the box in again before its wait; 9 no __syncthreads between the threads' writes of
/// the box (fill 0) and thread 0's store of it (but one between the store's issue and the wait);
/// 10 no fence_proxy_async_shared() after the threads' writes of the box; 11 thread 1 fences
/// before its writes of the box, not after.
extern "C" __global__ void store_box(unsigned short *dst,
                                     const __grid_constant__ spio::TensorMap dst_map,
                                     unsigned short *words,
                                     const __grid_constant__ spio::TensorMap src_map,
                                     const unsigned short *src, int c0, int c1, int c2, int c3,
                                     int fill, int bytes, int offset, int bug, int peek) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    unsigned char *box = smem + offset;
    unsigned short *box_words = reinterpret_cast<unsigned short *>(box);
    if (bug == 11 && threadIdx.x == 1) spio::fence_proxy_async_shared();
    if (fill == 0) {
        for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) box_words[i] = words[i];
    } else if (fill == 1 && threadIdx.x == 0) {
        spio::mbarrier_init(&bar, 1);
        spio::fence_mbarrier_init();
        spio::mbarrier_arrive_expect_tx(&bar, bytes);
        spio::cp_async_bulk_tensor_4d_g2s(box, &src_map, c0, c1, c2, c3, &bar);
        if (bug != 7) spio::mbarrier_wait_parity(&bar, 0);
    }
    if (bug != 10 && !(bug == 11 && threadIdx.x == 1)) spio::fence_proxy_async_shared();
    if (bug != 9) __syncthreads();
    if (threadIdx.x == 0) {
        spio::cp_async_bulk_tensor_4d_s2g(&dst_map, c0, c1, c2, c3, box);
        if (bug != 3) spio::cp_async_bulk_commit_group();
        if (bug == 4) words[0] = dst[peek];
        if (bug == 8) {
            spio::mbarrier_arrive_expect_tx(&bar, bytes);
            spio::cp_async_bulk_tensor_4d_g2s(box, &src_map, c0, c1, c2, c3, &bar);
        }
    }
    if (bug == 1 || bug == 5 || bug == 6 || bug == 9) __syncthreads();
    if (bug == 1) {
        if (threadIdx.x == 1) box_words[0] = 0x7777;
        __syncthreads();
    }
    if (threadIdx.x == 0 && bug != 2) {
        spio::cp_async_bulk_wait_group_read<0>();
        spio::cp_async_bulk_wait_group<0>();
    }
    if (bug == 5 && threadIdx.x == 1) words[0] = dst[peek];
    if (bug == 6 && threadIdx.x == 1) box_words[0] = 0x7777;
}

/// Every thread writes the `bytes` / 2 words of `words` to dynamic shared memory: box A at bytes
/// [0, bytes / 2), box B after it (bytes / 2 a multiple of 128). Thread 0 stores A at
/// (a0, a1, 0, 0) and commits, stores B at (b0, b1, 0, 0) and commits, commits `empties` empty
/// groups, then waits with cp_async_bulk_wait_group<1> and copies dst (`n` words) to snap[0..n),
/// then waits with cp_async_bulk_wait_group<0> and copies it to snap[n..2n).
extern "C" __global__ void store_groups(unsigned short *dst,
                                        const __grid_constant__ spio::TensorMap map,
                                        const unsigned short *words, unsigned short *snap, int a0,
                                        int a1, int b0, int b1, int bytes, int empties, int n) {
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned short *all = reinterpret_cast<unsigned short *>(smem);
    for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) all[i] = words[i];
    spio::fence_proxy_async_shared();
    __syncthreads();
    if (threadIdx.x == 0) {
        spio::cp_async_bulk_tensor_4d_s2g(&map, a0, a1, 0, 0, smem);
        spio::cp_async_bulk_commit_group();
        spio::cp_async_bulk_tensor_4d_s2g(&map, b0, b1, 0, 0, smem + bytes / 2);
        spio::cp_async_bulk_commit_group();
        for (int e = 0; e < empties; ++e) spio::cp_async_bulk_commit_group();
        spio::cp_async_bulk_wait_group<1>();
        for (int i = 0; i < n; ++i) snap[i] = dst[i];
        spio::cp_async_bulk_wait_group<0>();
        for (int i = 0; i < n; ++i) snap[n + i] = dst[i];
    }
}
"""

#: The value of the destination's elements before a store (every test tensor's values are > 0).
POISON = -7


@pytest.fixture(scope="module", params=COMPILERS)
def ts(request):
    return load(TENSOR_STORE, "emu_test_tensor_store", request.param)


def _store_reference(dst, values, coords):
    """dst ([N][H][W][C]) with the box `values` ([box n][box h][box w][box c]) written at coords
    (c, w, h, n), the box's elements outside dst left out."""
    out = dst.clone()
    box = tuple(reversed(values.shape))
    ic, iw, ih, in_ = (torch.arange(b) + c for b, c in zip(box, coords, strict=True))
    grid = torch.meshgrid(in_, ih, iw, ic, indexing="ij")
    inside = torch.ones(values.shape, dtype=torch.bool)
    for g, size in zip(grid, dst.shape, strict=True):
        inside &= (g >= 0) & (g < size)
    out[tuple(g[inside] for g in grid)] = values[inside]
    return out


def _store(
    ts, dst, dst_map, coords, *, words=None, src=None, src_map=None, offset=0, bug=0, peek=0,
    check=True, seed=None, fill=None,
):  # fmt: skip
    """Launches store_box (`fill` 0 when `words` is given, else 1 from `src` by `src_map`)."""
    fill = fill if fill is not None else 0 if words is not None else 1
    args = (
        dst,
        dst_map.emulator_bytes(),
        torch.zeros(1, dtype=torch.int16) if words is None else words,
        (dst_map if src_map is None else src_map).emulator_bytes(),
        torch.zeros(8, dtype=torch.int16) if src is None else src,
        *coords,
        fill,
        dst_map.box_bytes,
        offset,
        bug,
        peek,
    )
    ts.get_function("store_box").launch(
        1, 64, args, shared_mem_bytes=SHARED_BYTES, check=check, seed=seed
    )


@pytest.mark.parametrize("seed", [None, 5])
@pytest.mark.parametrize("shape,box,swizzle,coords", CASES)
def test_a_box_copied_in_and_stored_back_lands_where_it_came_from(
    ts, shape, box, swizzle, coords, seed
):
    """A box copied in (zeros outside the tensor) and stored back at the same coordinates writes
    only its elements inside the tensor, with their values: the clipped ones stay poisoned."""
    x = _nhwc(*shape)
    y = torch.full_like(x, POISON)
    src_map = TensorMap.of_tensor(x, (3, 2, 1, 0), box, swizzle=swizzle)
    dst_map = TensorMap.of_tensor(y, (3, 2, 1, 0), box, swizzle=swizzle)
    _store(ts, y, dst_map, coords, src=x, src_map=src_map, seed=seed)
    want = _store_reference(torch.full_like(x, POISON), _box_reference(x, box, coords), coords)
    assert torch.equal(y, want)


@pytest.mark.parametrize("shape,box,swizzle,coords", CASES)
def test_a_store_reads_its_box_through_the_swizzle(ts, shape, box, swizzle, coords):
    """Threads write the box's words where the swizzle puts them (CUTLASS's formulation, not the
    runtime's); the store takes them out of the swizzle, element by element."""
    values = _nhwc(*reversed(box), seed=3)
    words = _swizzled(values.flatten(), swizzle)
    y = torch.full(shape, POISON, dtype=torch.int16)
    dst_map = TensorMap.of_tensor(y, (3, 2, 1, 0), box, swizzle=swizzle)
    _store(ts, y, dst_map, coords, words=words)
    assert torch.equal(y, _store_reference(torch.full_like(y, POISON), values, coords))


@pytest.mark.parametrize("seed", [None, 5, 9])
def test_a_store_of_a_box_other_threads_wrote_needs_a_barrier(ts, seed):
    """Thread 0 stores a box that the other threads wrote with no __syncthreads in between: the
    store's read races with their writes, whichever runs first (the issue reads the box; a write
    after it meets a store still reading; the wait, after a barrier, reads it in order)."""
    shape, box, swizzle, coords = CASES[10]
    y = torch.full(shape, POISON, dtype=torch.int16)
    dst_map = TensorMap.of_tensor(y, (3, 2, 1, 0), box, swizzle=swizzle)
    words = _swizzled(_nhwc(*reversed(box), seed=4).flatten(), swizzle)
    with pytest.raises(
        EmulatorError,
        match=r"thread \((0,0,0\): shared-memory race: reads address 0x[0-9a-f]+, which thread "
        r"\([1-9][0-9]*,0,0\) wrote|[1-9][0-9]*,0,0\): (shared-memory race: writes address "
        r"0x[0-9a-f]+, which thread \(0,0,0\) read|writes shared address 0x[0-9a-f]+, which a "
        r"bulk tensor store \(cp_async_bulk_tensor_4d_s2g\) issued by thread \(0,0,0\) still "
        r"reads))",
    ):
        _store(ts, y, dst_map, coords, words=words, bug=9, seed=seed)


@pytest.mark.parametrize("bug, writer", [(10, r"[0-9]+"), (11, "1")])
@pytest.mark.parametrize("seed", [None, 5])
def test_a_store_of_a_box_written_without_a_proxy_fence_is_refused(ts, bug, writer, seed):
    """The store reads its box through the async proxy, which sees the threads' plain writes
    only where each writer called fence_proxy_async_shared() after them (and a barrier orders
    that before the store): with no fence, or thread 1's fence before its writes, a GPU may
    store stale bytes; the emulator, which sees them at once, says so. Where the box came in by
    a tensor copy (the async proxy itself), no fence is needed (fill 1, bug 10)."""
    shape, box, swizzle, coords = CASES[10]
    y = torch.full(shape, POISON, dtype=torch.int16)
    dst_map = TensorMap.of_tensor(y, (3, 2, 1, 0), box, swizzle=swizzle)
    values = _nhwc(*reversed(box), seed=4)
    with pytest.raises(
        EmulatorError,
        match=rf"thread \(0,0,0\): cp_async_bulk_tensor_4d_s2g issued by thread \(0,0,0\) reads "
        rf"shared address 0x[0-9a-f]+, which thread \({writer},0,0\) wrote with no "
        r"fence_proxy_async_shared\(\) after",
    ):
        _store(ts, y, dst_map, coords, words=_swizzled(values.flatten(), swizzle), bug=bug,
               seed=seed)  # fmt: skip
    x = _nhwc(*shape)
    y = torch.full_like(x, POISON)
    src_map = TensorMap.of_tensor(x, (3, 2, 1, 0), box, swizzle=swizzle)
    dst_map = TensorMap.of_tensor(y, (3, 2, 1, 0), box, swizzle=swizzle)
    _store(ts, y, dst_map, coords, src=x, src_map=src_map, bug=10, seed=seed)
    want = _store_reference(torch.full_like(x, POISON), _box_reference(x, box, coords), coords)
    assert torch.equal(y, want)


def test_an_unchecked_store_writes_the_same(ts):
    shape, box, swizzle, coords = CASES[10]
    values = _nhwc(*reversed(box), seed=4)
    y = torch.full(shape, POISON, dtype=torch.int16)
    dst_map = TensorMap.of_tensor(y, (3, 2, 1, 0), box, swizzle=swizzle)
    _store(ts, y, dst_map, coords, words=_swizzled(values.flatten(), swizzle), check=False)
    assert torch.equal(y, _store_reference(torch.full_like(y, POISON), values, coords))


def _groups(ts, empties, check):
    """store_groups on a [1][1][6][16] tensor: box A (16 x 4) at w -2, box B at w 3 (both
    clipped); returns the words of A and B, the tensor, and the two snapshots of it."""
    y = torch.full((1, 1, 6, 16), POISON, dtype=torch.int16)
    tmap = TensorMap.of_tensor(y, (3, 2, 1, 0), (16, 4, 1, 1))
    words = _nhwc(1, 1, 8, 16, seed=6)
    snap = torch.zeros(2, y.numel(), dtype=torch.int16)
    args = (y, tmap.emulator_bytes(), words, snap, 0, -2, 0, 3, 256, empties, y.numel())
    ts.get_function("store_groups").launch(1, 32, args, shared_mem_bytes=1024, check=check)
    return words[:, :, :4], words[:, :, 4:], y, snap.view(2, *y.shape)


@pytest.mark.parametrize("empties", [0, 1])
def test_wait_group_1_leaves_the_newest_group_pending(ts, empties):
    """wait_group<1> copies every group but the newest committed one (an empty group counts):
    the first snapshot has box A and, behind one empty group, box B; the second has both."""
    a, b, y, snap = _groups(ts, empties, check=False)
    poison = torch.full_like(y, POISON)
    with_a = _store_reference(poison, a, (0, -2, 0, 0))
    both = _store_reference(with_a, b, (0, 3, 0, 0))
    assert torch.equal(snap[0], both if empties else with_a)
    assert torch.equal(snap[1], both) and torch.equal(y, both)


def test_reading_a_pending_stores_destination_is_a_race(ts):
    """The snapshot after wait_group<1> reads box B's bytes, which the store may still write."""
    with pytest.raises(
        EmulatorError,
        match=r"thread \(0,0,0\): global-memory race: reads address 0x[0-9a-f]+, which a bulk "
        r"tensor store \(cp_async_bulk_tensor_4d_s2g\) from shared address 0x[0-9a-f]+ issued by "
        r"thread \(0,0,0\) writes, before that thread's cp_async_bulk_wait_group covering the "
        r"store \(the store may write any time until then\)",
    ):
        _groups(ts, 0, check=True)
    _groups(ts, 1, check=True)  # both retired: nothing pending to read


def _inside_store(ts, bug, check=True, swizzle=0, seed=None):
    """store_box of a box wholly inside the tensor with `bug`: the tensor, and the box values."""
    x = _nhwc(2, 3, 8, 64)
    y = torch.full_like(x, POISON)
    box, coords = (64, 8, 1, 1), (0, 0, 2, 1)
    src_map = TensorMap.of_tensor(x, (3, 2, 1, 0), box, swizzle=swizzle)
    dst_map = TensorMap.of_tensor(y, (3, 2, 1, 0), box, swizzle=swizzle)
    peek = (1 * 3 + 2) * 8 * 64 + 5  # element (n 1, h 2, w 0, c 5): inside the box
    _store(
        ts, y, dst_map, coords, src=x, src_map=src_map, bug=bug, peek=peek, check=check, seed=seed
    )
    return y, _box_reference(x, box, coords)


def test_overwriting_the_source_before_the_wait_is_reported(ts):
    with pytest.raises(
        EmulatorError,
        match=r"thread \(1,0,0\): writes shared address 0x[0-9a-f]+, which a bulk tensor store "
        r"\(cp_async_bulk_tensor_4d_s2g\) issued by thread \(0,0,0\) still reads: that thread "
        r"must cp_async_bulk_wait_group_read for the store first \(then a __syncthreads\(\) "
        r"before other threads write\)",
    ):
        _inside_store(ts, bug=1)


@pytest.mark.parametrize("swizzle", [0, 128])
def test_an_unchecked_store_copies_its_source_at_the_wait(ts, swizzle):
    """The store copies when its wait retires it (the latest the hardware may read its source):
    unchecked, the overwrite before the wait is what lands, at the box's first element (the
    swizzle leaves the first chunk in place)."""
    y, values = _inside_store(ts, bug=1, check=False, swizzle=swizzle)
    values.view(-1)[0] = 0x7777
    assert torch.equal(y, _store_reference(torch.full_like(y, POISON), values, (0, 0, 2, 1)))


def test_overwriting_the_source_after_the_wait_needs_a_barrier(ts):
    """The store's read of its box ends at its thread's wait: another thread's write after it
    must be ordered after the wait by a __syncthreads."""
    with pytest.raises(
        EmulatorError,
        match=r"thread \(1,0,0\): shared-memory race: writes address 0x[0-9a-f]+, which thread "
        r"\(0,0,0\) read with no __syncthreads\(\) in between",
    ):
        _inside_store(ts, bug=6)


def test_copying_onto_the_source_before_the_wait_is_reported(ts):
    with pytest.raises(
        EmulatorError,
        match=r"thread \(0,0,0\): cp_async_bulk_tensor_4d_g2s writes shared address 0x[0-9a-f]+, "
        r"which a bulk tensor store \(cp_async_bulk_tensor_4d_s2g\) issued by thread \(0,0,0\) "
        r"still reads",
    ):
        _inside_store(ts, bug=8)


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("bug", [2, 3], ids=["no-wait", "no-commit"])
def test_a_block_that_ends_with_a_store_not_waited_for_is_reported(ts, bug, check):
    """A store left in flight (never waited for, or in a group never committed, which no wait
    covers) may read shared memory after the block has gone: reported, checked or not."""
    with pytest.raises(
        EmulatorError,
        match=r"block \(0,0,0\): the block ends with 1 bulk tensor store issued by thread "
        r"\(0,0,0\) not waited for \(cp_async_bulk_wait_group\)",
    ):
        _inside_store(ts, bug=bug, check=check)


@pytest.mark.parametrize(
    "bug,message",
    [
        (4, r"thread \(0,0,0\): global-memory race: reads address 0x[0-9a-f]+, which a bulk "
            r"tensor store \(cp_async_bulk_tensor_4d_s2g\) from shared address 0x[0-9a-f]+ issued "
            r"by thread \(0,0,0\) writes, before that thread's cp_async_bulk_wait_group"),
        (5, r"thread \(1,0,0\): global-memory race: reads address 0x[0-9a-f]+, which thread "
            r"\(0,0,0\) wrote with no __syncthreads\(\) in between"),
    ],
    ids=["before-the-wait", "after-the-wait-without-a-barrier"],
)  # fmt: skip
def test_reading_the_destination_too_early_is_a_race(ts, bug, message):
    with pytest.raises(EmulatorError, match=message):
        _inside_store(ts, bug=bug)


def test_storing_a_box_that_has_not_landed_is_a_stale_read(ts):
    with pytest.raises(
        EmulatorError,
        match=r"thread \(0,0,0\): reads shared address 0x[0-9a-f]+, the destination of an async "
        r"copy \(cp.async or bulk\) issued by thread \(0,0,0\), before a cp_async_wait_group/"
        r"cp_async_wait_all or mbarrier wait covering it \(stale data\)",
    ):
        _inside_store(ts, bug=7)


@pytest.mark.parametrize(
    "offset,swizzle,message",
    [
        (64, 0, r"cp_async_bulk_tensor_4d_s2g source: shared address 0x[0-9a-f]+ is not 128-byte "
                r"aligned"),
        (128, 128, r"cp_async_bulk_tensor_4d_s2g: a 128-byte swizzle's source must be aligned to "
                   r"its repeat, 1024 bytes \(8 rows of its span\), for the box to be read in the "
                   r"layout spio's buffers expect; got 0x"),
        (SHARED_BYTES - 512, 0, r"cp_async_bulk_tensor_4d_s2g source: address 0x[0-9a-f]+ is "
                                r"not inside the block's shared memory"),
    ],
    ids=["off-128", "off-the-swizzle-repeat", "past-shared-memory"],
)  # fmt: skip
def test_a_misplaced_source_is_refused(ts, offset, swizzle, message):
    x = _nhwc(1, 1, 8, 64)
    tmap = TensorMap.of_tensor(x, (3, 2, 1, 0), (64, 8, 1, 1), swizzle=swizzle)
    with pytest.raises(EmulatorError, match=message):
        _store(ts, x, tmap, (0, 0, 0, 0), offset=offset, fill=2)


def test_a_store_past_every_tensor_is_an_out_of_bounds_write(ts):
    """The map claims 4 rows of y's 3: the store of the fourth lies past y (in its guard zone).
    The rows, contiguous in both memories, are one run of 128 bytes, and none of it is written."""
    y = torch.full((1, 3, 1, 16), POISON, dtype=torch.int16)
    tmap = TensorMap(y.data_ptr(), 2, (16, 1, 4, 1), (32, 32, 128), (16, 1, 4, 1))
    with pytest.raises(
        EmulatorError,
        match=r"out-of-bounds global-memory access: cp_async_bulk_tensor_4d_s2g writes 128 bytes "
        r"at 0x[0-9a-f]+, outside every tensor passed to the kernel",
    ):
        _store(ts, y, tmap, (0, 0, 0, 0), words=_nhwc(1, 4, 1, 16).flatten())
    assert (y == POISON).all()


def test_a_store_with_a_map_of_another_rank_is_refused(ts):
    y = torch.full((2, 3, 5, 16), POISON, dtype=torch.int16)
    tmap = TensorMap.of_tensor(y.view(6, 5, 16), (2, 1, 0), (8, 6, 1))
    with pytest.raises(
        EmulatorError,
        match="cp_async_bulk_tensor_4d_s2g: the tensor map has rank 3, but the copy gives 4",
    ):
        _store(ts, y, tmap, (0, 0, 0, 0), words=_nhwc(1, 1, 6, 8).flatten())


def test_tensor_store_kernels_compile_with_nvrtc_for_sm_90():
    """The GPU branch of the store, its commit and its waits build too."""
    result = _compile_for_sm_90(TENSOR_STORE, "emu_tensor_store.cu")
    assert result.cubin and result.warnings == []
