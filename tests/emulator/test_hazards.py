"""Planted bugs are reported by the checked emulator, and their fixed versions pass."""

import re

import pytest
import torch

from spio.emulator import EmulatorError


def test_missing_syncthreads_is_a_race(hazards):
    x = torch.randn(128)
    with pytest.raises(EmulatorError, match=r"race.*(wrote|read)") as info:
        hazards.get_function("neighbour").launch(1, 128, (torch.zeros(128), x, 0))
    message = str(info.value)
    assert "neighbour" in message and "block (0,0,0)" in message and "thread (" in message


@pytest.mark.parametrize("seed", [None, 7])
def test_fixed_neighbour_passes(hazards, seed):
    x = torch.randn(128)
    out = torch.zeros(128)
    hazards.get_function("neighbour").launch(1, 128, (out, x, 1), seed=seed)
    assert torch.equal(out, x.roll(-1))


def test_missing_cp_async_wait_is_a_stale_read(hazards):
    with pytest.raises(EmulatorError, match="before a cp_async_wait"):
        hazards.get_function("staged").launch(1, 64, (torch.zeros(64), torch.randn(256), 0))


def test_missing_cp_async_wait_reads_poison_unchecked(hazards):
    out = torch.zeros(64)
    hazards.get_function("staged").launch(1, 64, (out, torch.randn(256), 0), check=False)
    assert torch.isnan(out).all()


def test_fixed_staged_passes(hazards):
    x = torch.randn(256)
    out = torch.zeros(64)
    hazards.get_function("staged").launch(1, 64, (out, x, 1))
    assert torch.equal(out, x[(4 * torch.arange(64) + 5) % 256])


def test_copy_in_flight_at_thread_exit_is_reported(hazards):
    args = (torch.zeros(64), torch.randn(512), 0)
    with pytest.raises(EmulatorError, match="exits with 1 cp.async copy still in flight") as info:
        hazards.get_function("prefetch_tail").launch(1, 64, args)
    assert "prefetch_tail" in str(info.value) and "thread (" in str(info.value)


@pytest.mark.parametrize("check", [True, False])
def test_copy_waited_for_before_exit_passes(hazards, check):
    x = torch.randn(512)
    out = torch.zeros(64)
    hazards.get_function("prefetch_tail").launch(1, 64, (out, x, 1), check=check)
    assert torch.equal(out, x[:256:4])


def test_copy_in_flight_at_exit_is_not_reported_unchecked(hazards):
    x = torch.randn(512)
    out = torch.zeros(64)
    hazards.get_function("prefetch_tail").launch(1, 64, (out, x, 0), check=False)
    assert torch.equal(out, x[:256:4])


def test_off_by_one_global_write(hazards):
    n = 300
    with pytest.raises(EmulatorError, match="out-of-bounds global") as info:
        hazards.get_function("shifted_write").launch(3, 128, (torch.zeros(n), torch.randn(n), n, 1))
    # The last valid index n-1 = 299 belongs to block 2, thread 43.
    assert "block (2,0,0)" in str(info.value) and "thread (43,0,0)" in str(info.value)


def test_shifted_write_in_bounds_passes(hazards):
    n = 300
    x = torch.randn(n)
    out = torch.zeros(n)
    hazards.get_function("shifted_write").launch(3, 128, (out, x, n, 0))
    assert torch.equal(out, x)


def test_out_of_range_static_shared_index(shared_oob):
    with pytest.raises(EmulatorError, match="out-of-bounds shared") as info:
        shared_oob.get_function("shared_index").launch(
            1, 128, (torch.zeros(128), torch.randn(128), 1)
        )
    assert "thread (127,0,0)" in str(info.value)


def test_static_shared_index_in_range_passes(shared_oob):
    x = torch.randn(128)
    out = torch.zeros(128)
    shared_oob.get_function("shared_index").launch(1, 128, (out, x, 0))
    assert torch.equal(out, x)


def test_out_of_range_dynamic_shared_index(shared_oob):
    fn = shared_oob.get_function("dynamic_index")
    with pytest.raises(EmulatorError, match="out-of-bounds shared"):
        fn.launch(1, 128, (torch.zeros(128), torch.randn(128), 1), shared_mem_bytes=512)
    x = torch.randn(128)
    out = torch.zeros(128)
    fn.launch(1, 128, (out, x, 0), shared_mem_bytes=512)
    assert torch.equal(out, x)


def test_lanes_exiting_before_a_warp_collective(hazards):
    # (not "exited" alone: the deadlock report, another failure, names exited threads too)
    with pytest.raises(EmulatorError, match="waits for lanes that have exited|exits"):
        hazards.get_function("early_exit").launch(1, 32, (torch.zeros(32, dtype=torch.int32), 1))
    out = torch.zeros(32, dtype=torch.int32)
    hazards.get_function("early_exit").launch(1, 32, (out, 0))
    assert out.tolist() == [lane ^ 1 for lane in range(32)]


def test_read_modify_write_race_reports_its_write(hazards):
    """`total += v` by every thread: the store after the load is checked too (the checked build
    used to drop it, so the lost update went unreported)."""
    with pytest.raises(EmulatorError, match=r"race: reads .* which thread \(0,0,0\) wrote"):
        hazards.get_function("shared_sum").launch(1, 128, (torch.zeros(1), torch.randn(128), 0))
    x = torch.randn(128)
    out = torch.zeros(1)
    hazards.get_function("shared_sum").launch(1, 128, (out, x, 1))
    torch.testing.assert_close(out.double(), x.double().sum().view(1), rtol=1e-5, atol=1e-5)


def test_ldmatrix_reading_copies_not_waited_for_is_a_stale_read(hazards):
    m = torch.randint(-(2**15), 2**15, (8, 8), dtype=torch.int16)
    fn = hazards.get_function("ldm_staged")
    with pytest.raises(EmulatorError, match="before a cp_async_wait_group/cp_async_wait_all"):
        fn.launch(1, 32, (torch.zeros(32, dtype=torch.int32), m, 0))
    out = torch.zeros(32, dtype=torch.int32)
    fn.launch(1, 32, (out, m, 1))
    lane = torch.arange(32)
    lo, hi = m[lane >> 2, 2 * (lane % 4)], m[lane >> 2, 2 * (lane % 4) + 1]
    want = (lo.to(torch.int64) & 0xFFFF) | ((hi.to(torch.int64) & 0xFFFF) << 16)
    assert torch.equal(out.to(torch.int64) & 0xFFFFFFFF, want)


@pytest.mark.parametrize("bad_row", [0, 5])
def test_every_ldmatrix_row_address_must_be_16_byte_aligned(hazards, bad_row):
    with pytest.raises(EmulatorError, match="ldmatrix row address: .* is not 16-byte aligned"):
        hazards.get_function("ldm_row_alignment").launch(
            1, 32, (torch.zeros(32, dtype=torch.int32), bad_row)
        )


@pytest.mark.parametrize(
    "kernel, block, n_in, n_out, message, want",
    [
        # A wait makes a copy visible to the thread that issued it, not to its neighbours.
        ("landed_neighbour", 64, 256, 64, r"race: reads .* which thread \(0,0,0\) wrote",
         lambda x: torch.cat([torch.zeros(1), x[0:252:4]])),
        ("pair_store", 128, 128, 64, r"race: writes .* which thread \(0,0,0\) wrote",
         lambda x: x[::2]),
    ],
)  # fmt: skip
def test_shared_races_reported_and_fixed(hazards, kernel, block, n_in, n_out, message, want):
    """Unfixed (last argument 0) the race is reported; fixed, the kernel gives `want`."""
    fn = hazards.get_function(kernel)
    with pytest.raises(EmulatorError, match=message):
        fn.launch(1, block, (torch.zeros(n_out), torch.randn(n_in), 0))
    x = torch.randn(n_in)
    out = torch.zeros(n_out)
    fn.launch(1, block, (out, x, 1), seed=2)
    assert torch.equal(out, want(x))


def test_a_store_after_another_warps_read_races(hazards):
    fn = hazards.get_function("read_then_store")
    with pytest.raises(EmulatorError, match=r"race: writes .* which thread \(0,0,0\) read"):
        fn.launch(1, 64, (torch.zeros(64), 0))
    out = torch.zeros(64)
    fn.launch(1, 64, (out, 1))
    assert out.tolist() == [1.0] + [0.0] * 63


def test_a_write_must_follow_every_unordered_read_of_the_warp(hazards):
    """Lanes 0 and 1 read; lane 2 writes after a __syncwarp with lane 0 alone: lane 1's read is
    unordered (both reads must be remembered, not only the first)."""
    fn = hazards.get_function("reader_pair")
    with pytest.raises(EmulatorError, match=r"race: writes .* which other threads read"):
        fn.launch(1, 32, (torch.zeros(32, dtype=torch.int32), 0))
    out = torch.zeros(32, dtype=torch.int32)
    fn.launch(1, 32, (out, 1))
    assert out.tolist() == [5, 5] + [0] * 30


@pytest.mark.parametrize("seed", [None, 4])
def test_exited_threads_release_a_barrier(hazards, seed):
    """PTX exit: a barrier that waits only for threads that have exited is released."""
    x = torch.randn(32)
    out = torch.zeros(32)
    hazards.get_function("exit_then_barrier").launch(1, 64, (out, x), seed=seed)
    assert torch.equal(out, x.flip(0))


def test_a_barrier_no_thread_can_pass_is_a_deadlock(hazards):
    with pytest.raises(EmulatorError, match=r"deadlock: 16 threads wait at __syncthreads\(\)"):
        hazards.get_function("split_barriers").launch(
            1, 32, (torch.zeros(32, dtype=torch.int32),), seed=None
        )


def test_a_vector_load_running_past_a_tensor_is_out_of_bounds(hazards):
    """One 16-byte access whose first 8 bytes are inside the tensor: every byte is checked."""
    fn = hazards.get_function("vector_copy")
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access: reads"):
        fn.launch(1, 1, (torch.zeros(4), torch.randn(6), 4))
    x = torch.randn(8)
    out = torch.zeros(4)
    fn.launch(1, 1, (out, x, 4))
    assert torch.equal(out, x[4:])


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_a_misaligned_vector_load_faults_as_on_a_gpu(hazards, offset):
    """A 16-byte vector load from an address only 4- or 8-byte aligned faults on a GPU
    ("misaligned address"); the emulator ran it, so a kernel staging its output 8 bytes off a
    16-byte boundary passed every CPU test (or, a float4 copy, crashed the process)."""
    fn = hazards.get_function("vector_copy")
    said = r"misaligned address: .* 'const struct float4' at 0x[0-9a-f]+, not 16-byte aligned"
    with pytest.raises(EmulatorError, match=said + r" as its type needs \(a GPU faults\), at "):
        fn.launch(1, 1, (torch.zeros(4), torch.randn(8), offset))


@pytest.mark.parametrize("store", [0, 1])
def test_a_misaligned_shared_vector_access_faults_and_an_aligned_one_passes(hazards, store):
    fn = hazards.get_function("shared_vector")
    said = r"misaligned address: .* '(const )?struct uint4' at 0x[0-9a-f]+, not 16-byte aligned"
    for offset in (4, 8, 12):
        with pytest.raises(EmulatorError, match=said):
            fn.launch(1, 1, (torch.zeros(4, dtype=torch.int32), offset, store))
    out = torch.zeros(4, dtype=torch.int32)
    fn.launch(1, 1, (out, 16, store))
    assert out.tolist() == ([100, 101, 102, 103] if store else [4, 5, 6, 7])


@pytest.mark.parametrize("kernel", ["struct_copy", "struct_read"])
def test_a_16_byte_struct_of_8_byte_alignment_may_sit_at_an_8_byte_boundary(hazards, kernel):
    """Its type needs 8 bytes of alignment, not 16 (a GPU loads it in two 8-byte loads): a first
    form of the check, by access size, had failed it."""
    out = torch.zeros(4, dtype=torch.int64)
    hazards.get_function(kernel).launch(1, 1, (out, torch.arange(8, dtype=torch.int64)))
    assert out.tolist() == ([0, 1, 2, 0] if kernel == "struct_copy" else [1, 2, 0, 0])


def test_out_of_range_dynamic_shared_read(shared_oob):
    fn = shared_oob.get_function("dynamic_read_index")
    with pytest.raises(EmulatorError, match="out-of-bounds shared-memory access: reads"):
        fn.launch(1, 128, (torch.zeros(128), torch.randn(128), 1), shared_mem_bytes=512)


def test_unchecked_run_skips_checks(hazards):
    x = torch.randn(128)
    out = torch.zeros(128)
    hazards.get_function("neighbour").launch(1, 128, (out, x, 0), check=False)
    # Fibers run until they block: without a barrier, thread i reads s[i+1] before it is written.
    assert torch.isnan(out[:127]).all() and out[127] == x[0]


def _bulk_want(x, rows):
    return x.view(rows, 64)[:, (torch.arange(64) * 5) % 64]


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_bulk_copies_through_mbarriers(bulk, rows):
    x = torch.randn(rows * 64)
    out = torch.zeros(rows, 64)
    bulk.get_function("bulk_rows").launch(1, 64, (out, x, rows, 0))
    assert torch.equal(out, _bulk_want(x, rows))


@pytest.mark.parametrize(
    "bug,message",
    [
        (1, "before a cp_async_wait_group/cp_async_wait_all or mbarrier wait"),
        (2, "mbarrier wait never ends"),
        (3, "before a cp_async_wait_group/cp_async_wait_all or mbarrier wait"),
        # Which comes first depends on the order threads run: a stale read, or a wait for a
        # phase that never comes.
        (4, "before a cp_async_wait_group/cp_async_wait_all or mbarrier wait|wait never ends"),
    ],
    ids=["read-before-wait", "too-many-bytes-announced", "last-wait-skipped", "wrong-parity"],
)
def test_bulk_copy_bugs_are_reported(bulk, bug, message):
    with pytest.raises(EmulatorError, match=message):
        bulk.get_function("bulk_rows").launch(1, 64, (torch.zeros(5, 64), torch.randn(320), 5, bug))


@pytest.mark.parametrize("seed", [None, 3])
def test_two_arrivals_with_a_copy_each_complete_each_phase(bulk, seed):
    """Each arrival adds its announced bytes to the phase's transaction count, and every phase
    waits for all mbarrier_init's arrivals."""
    x = torch.randn(128)
    out = torch.zeros(2, 64)
    bulk.get_function("bulk_two_arrivals").launch(1, 64, (out, x), seed=seed)
    assert torch.equal(out, _bulk_want(x, 2))


def test_a_bulk_copy_no_thread_waits_for_is_reported(bulk):
    with pytest.raises(EmulatorError, match="the block ends with 1 bulk copies on the mbarrier"):
        bulk.get_function("bulk_unwaited").launch(1, 32, (torch.randn(64),))


def test_emulator_order_seed(monkeypatch):
    """SPIO_EMULATOR_ORDER_SEED shuffles emulated block and thread order (unset: index order)."""
    from spio.kernels import kernel as K

    monkeypatch.delenv("SPIO_EMULATOR_ORDER_SEED", raising=False)
    assert K._emulator_order_seed() is None
    monkeypatch.setenv("SPIO_EMULATOR_ORDER_SEED", " 7 ")
    assert K._emulator_order_seed() == 7
    monkeypatch.setenv("SPIO_EMULATOR_ORDER_SEED", "seven")
    with pytest.raises(ValueError, match="ORDER_SEED must be an integer, got 'seven'"):
        K._emulator_order_seed()


# Checked launches copy every tensor whose bytes are dense (contiguous, channels_last, any
# permutation) into a buffer with unregistered guard zones, so an access just past its end is
# reported even when the next tensor starts right there.


def _side_by_side_nhwc(shape=(2, 8, 3, 5)):
    """A buffer holding two channels_last tensors of `shape`, the second right after the first."""
    n, c, h, w = shape
    numel = n * c * h * w
    buf = torch.randn(2 * numel)
    strides = (h * w * c, 1, w * c, c)
    first = torch.as_strided(buf, shape, strides, 0)
    second = torch.as_strided(buf, shape, strides, numel)
    assert first.is_contiguous(memory_format=torch.channels_last) and not first.is_contiguous()
    return buf, first, second


def test_read_past_a_channels_last_tensor_is_out_of_bounds(hazards):
    _, x, y = _side_by_side_nhwc()
    out = torch.zeros_like(x)
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access: reads"):
        hazards.get_function("read_ahead").launch(2, 128, (out, x, y, x.numel(), 1))


def test_write_past_a_channels_last_tensor_is_out_of_bounds(hazards):
    _, out, x = _side_by_side_nhwc()
    before = x.clone()
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access: writes"):
        hazards.get_function("shifted_write").launch(2, 128, (out, x, out.numel(), 1))
    assert torch.equal(x, before)  # the stray store hit the guard zone, not the next tensor


def test_channels_last_tensors_in_bounds_pass_and_copy_back(hazards):
    _, x, y = _side_by_side_nhwc()
    out = torch.full(x.shape, float("nan")).to(memory_format=torch.channels_last)
    hazards.get_function("read_ahead").launch(2, 128, (out, x, y, x.numel(), 0))
    assert out.stride() == x.stride() and torch.equal(out, x + y)


def test_unchanged_channels_last_inputs_are_not_copied_back(hazards):
    """Inputs holding NaNs compare equal bit for bit: no copy back, no autograd version bump."""
    _, x, y = _side_by_side_nhwc()
    x[0, 0, 0, 0] = float("nan")
    version = x._version
    out = torch.zeros_like(x)
    hazards.get_function("read_ahead").launch(2, 128, (out, x, y, x.numel(), 0))
    assert x._version == version and torch.isnan(out[0, 0, 0, 0])


# A cp.async or bulk copy may write its destination any time after it is issued: reads of those
# bytes by other threads earlier in the same barrier epoch race with it, even when the wait that
# completes the copy comes after a __syncthreads.


def test_cp_async_refill_before_the_readers_barrier_is_a_race(hazards):
    with pytest.raises(
        EmulatorError, match=r"race: cp_async_16 writes .* which thread \(0,0,0\) read"
    ):
        hazards.get_function("refill").launch(1, 64, (torch.zeros(64), torch.randn(512), 0))


@pytest.mark.parametrize("seed", [None, 3])
def test_cp_async_refill_after_a_barrier_passes(hazards, seed):
    x = torch.randn(512)
    out = torch.zeros(64)
    hazards.get_function("refill").launch(1, 64, (out, x, 1), seed=seed)
    ahead = torch.cat([x[4:256:4], torch.zeros(1)])
    assert torch.equal(out, ahead + x[256::4])


def test_bulk_refill_before_the_readers_barrier_is_a_race(bulk):
    with pytest.raises(EmulatorError, match=r"race: cp_async_bulk_g2s writes .* read"):
        bulk.get_function("bulk_refill").launch(1, 64, (torch.zeros(64), torch.randn(128), 0))


@pytest.mark.parametrize("seed", [None, 3])
def test_bulk_refill_after_a_barrier_passes(bulk, seed):
    x = torch.randn(128)
    out = torch.zeros(64)
    bulk.get_function("bulk_refill").launch(1, 64, (out, x, 1), seed=seed)
    assert torch.equal(out, x[(torch.arange(64) * 5) % 64] + x[64:])


# Data a bulk copy lands is visible to the threads that waited on its mbarrier phase, and to the
# others only after a __syncthreads.


def test_reading_bulk_data_without_waiting_is_reported(bulk):
    """In index order thread 0 issues and waits before the others read: their reads find the
    landed data without a wait of their own. (In shuffled orders some read before the copy is
    issued, which the issue-time check reports instead.)"""
    with pytest.raises(EmulatorError, match="without a wait of its own on that phase"):
        bulk.get_function("bulk_one_waiter").launch(
            1, 64, (torch.zeros(64), torch.randn(64), 0), seed=None
        )


@pytest.mark.parametrize("seed", [None, 1])
def test_bulk_data_passed_on_by_a_barrier_passes(bulk, seed):
    x = torch.randn(64)
    out = torch.zeros(64)
    bulk.get_function("bulk_one_waiter").launch(1, 64, (out, x, 1), seed=seed)
    assert torch.equal(out, x[(torch.arange(64) * 5) % 64])


# __syncwarp(mask) orders memory only among the lanes in mask, and the halves of a diverged warp
# may run collectives on disjoint masks at the same time.


def test_syncwarp_of_each_half_does_not_order_the_other_half(hazards):
    out = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(EmulatorError, match=r"race: reads .* which thread \(15,0,0\) wrote"):
        hazards.get_function("half_syncwarp").launch(1, 32, (out, 0))


def test_full_syncwarp_orders_the_halves(hazards):
    out = torch.zeros(32, dtype=torch.int32)
    hazards.get_function("half_syncwarp").launch(1, 32, (out, 1))
    assert out.tolist() == [0] * 16 + [lane + 100 for lane in range(16)]


@pytest.mark.parametrize("global_mem", [0, 1])
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_a_lane_rereading_after_syncwarp_may_write(hazards, global_mem, seed):
    """All lanes read, __syncwarp, then lane 0 reads again and writes: legal (it was reported,
    the earlier reads dated at the re-read's sync generation)."""
    count = torch.zeros(33, dtype=torch.int32)
    count[0] = 7
    hazards.get_function("reread_after_syncwarp").launch(1, 32, (count, global_mem), seed=seed)
    assert count[1:].tolist() == [7 + 8] * 32


@pytest.mark.parametrize("seed", [None, 1, 2, 3, 4])
def test_collectives_on_disjoint_masks_pass(hazards, seed):
    out = torch.zeros(32, 3, dtype=torch.int32)
    hazards.get_function("warp_halves").launch(1, 32, (out, 0), seed=seed)
    got = out.to(torch.int64) & 0xFFFFFFFF
    for lane in range(32):
        ballot = 0x0000AAAA if lane < 16 else 0xAAAA0000
        assert got[lane].tolist() == [lane ^ 1, lane ^ 2, ballot], f"lane {lane}"


def test_collectives_on_overlapping_masks_are_divergent(hazards):
    out = torch.zeros(32, 3, dtype=torch.int32)
    with pytest.raises(EmulatorError, match="divergent warp collectives"):
        hazards.get_function("warp_halves").launch(1, 32, (out, 1))


def test_a_shuffle_from_a_lane_outside_its_mask_fails(hazards):
    """PTX leaves the value undefined; the emulator had given the reading lane its own."""
    out = torch.zeros(32, 3, dtype=torch.int32)
    outside = r"mask 0xffff(0000)? reads lane (16|0), outside the mask"
    with pytest.raises(EmulatorError, match=outside):
        hazards.get_function("warp_halves").launch(1, 32, (out, 2))


# Global memory: blocks run one after another in the emulator, so a kernel whose blocks share
# bytes gives the right answer there and a race on a GPU. Checked launches report a block storing
# to bytes another block stored to or loaded in the same launch, a block loading bytes another
# block stored to, plain accesses mixed with atomics, and races between a block's threads.


def test_two_blocks_storing_the_same_bytes_race(global_races):
    x = torch.randn(4)
    with pytest.raises(
        EmulatorError, match=r"global-memory race: writes .* of block \(0,0,0\) wrote"
    ) as info:
        global_races.get_function("store_per_block").launch(4, 32, (torch.zeros(4), x, 1))
    assert "block (1,0,0), thread (0,0,0)" in str(info.value)


def test_loading_what_another_block_stored_races(global_races):
    with pytest.raises(
        EmulatorError, match=r"global-memory race: reads .* of block \(0,0,0\) wrote"
    ):
        global_races.get_function("prefix_step").launch(4, 32, (torch.zeros(4), torch.randn(4), 1))


def test_storing_what_another_block_loaded_races(global_races):
    with pytest.raises(
        EmulatorError, match=r"global-memory race: writes .* of block \(0,0,0\) read"
    ):
        global_races.get_function("shift_down").launch(
            4, 32, (torch.randn(4), torch.randn(4), 4, 1)
        )


@pytest.mark.parametrize("seed", [None, 5])
def test_a_lost_update_across_blocks_races(global_races, seed):
    with pytest.raises(EmulatorError, match="global-memory race"):
        global_races.get_function("add_one").launch(4, 1, (torch.zeros(1),), seed=seed)


@pytest.mark.parametrize("bug", [1, 2, 3])
@pytest.mark.parametrize("seed", [None, 5])
def test_plain_accesses_mixed_with_atomics_race(global_races, bug, seed):
    counts = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(EmulatorError, match="global-memory race: .*atomic"):
        global_races.get_function("count_threads").launch(3, 64, (counts, bug), seed=seed)


def test_a_cp_async_from_another_blocks_row_races(global_races):
    """cp.async loads of global memory take part in the race checks like plain loads."""
    fn = global_races.get_function("row_handoff")
    with pytest.raises(EmulatorError, match=r"global-memory race: .* of block \(\d,0,0\)"):
        fn.launch(4, 32, (torch.zeros(16), torch.zeros(16), 1))
    out = torch.zeros(16)
    fn.launch(4, 32, (out, torch.zeros(16), 0), seed=5)
    assert torch.equal(out, torch.arange(4.0).repeat_interleave(4))


def test_threads_of_a_block_racing_on_global_memory(global_races):
    with pytest.raises(
        EmulatorError, match=r"global-memory race: writes .* which thread \(0,0,0\) read"
    ):
        global_races.get_function("global_neighbour").launch(
            1, 64, (torch.zeros(64), torch.zeros(64), 0)
        )


@pytest.mark.parametrize("seed", [None, 5])
def test_blocks_sharing_nothing_pass(global_races, seed):
    """Disjoint stores, many blocks loading the same never-stored bytes, atomics among
    themselves and barrier-ordered threads are not races."""
    x = torch.randn(4)
    out = torch.zeros(4)
    global_races.get_function("store_per_block").launch(4, 32, (out, x, 0), seed=seed)
    assert torch.equal(out, x + x[0])
    global_races.get_function("prefix_step").launch(4, 32, (out, x, 0), seed=seed)
    assert torch.equal(out, x + torch.cat([torch.zeros(1), x[:-1]]))
    y = torch.randn(4)
    xs = torch.randn(4)
    want = torch.cat([y[1:], xs[3:]])
    global_races.get_function("shift_down").launch(4, 32, (xs, y, 4, 0), seed=seed)
    assert torch.equal(xs, want)
    counts = torch.zeros(2, dtype=torch.int32)
    global_races.get_function("count_threads").launch(3, 64, (counts, 0), seed=seed)
    assert counts.tolist() == [192, 0]
    out64 = torch.zeros(64)
    global_races.get_function("global_neighbour").launch(1, 64, (out64, torch.zeros(64), 1))
    assert torch.equal(out64, torch.arange(64).roll(-1).float())


def test_aliased_arguments_share_one_record(global_races):
    """The same tensor as input and output: block b loads x[b - 1], which block b - 1 stored."""
    x = torch.randn(4)
    with pytest.raises(
        EmulatorError, match=r"global-memory race: reads .* of block \(0,0,0\) wrote"
    ):
        global_races.get_function("prefix_step").launch(4, 32, (x, x, 0))


@pytest.mark.parametrize("seed", [None, 5])
def test_races_far_into_a_large_tensor(global_races, seed):
    """Bytes past the first 64 KiB of a tensor (the record is kept in chunks made on first use)."""
    out = torch.zeros(20000)
    with pytest.raises(EmulatorError, match="global-memory race: writes"):
        global_races.get_function("store_at").launch(3, 32, (out, 17000, 1), seed=seed)
    out = torch.zeros(20000)
    global_races.get_function("store_at").launch(3, 32, (out, 19997, 0), seed=seed)
    assert out[19997:].tolist() == [0.0, 1.0, 2.0]


def test_a_second_launch_starts_with_a_clean_record(global_races):
    """Stores of one launch are no race with loads of the next."""
    x = torch.randn(4)
    out = torch.zeros(4)
    fn = global_races.get_function("prefix_step")
    fn.launch(4, 32, (out, x, 0))
    fn.launch(4, 32, (torch.zeros(4), out, 0))


@pytest.mark.parametrize("bug,issuer", [(1, 0), (2, 1)], ids=["own", "other"])
def test_overwriting_a_cp_async_source_before_the_wait_races(hazards, bug, issuer):
    """The copy reads its source any time until its thread's wait: a store to it in between, by
    the issuing thread or (after a barrier) by another, may land before the read or after.
    Thread 0 runs first and stores to its own source (bug 1) or thread 1's (bug 2)."""
    src = torch.arange(256, dtype=torch.float32)
    with pytest.raises(EmulatorError) as info:
        hazards.get_function("source_overwritten").launch(1, 64, (torch.zeros(64), src, bug))
    message = str(info.value)
    assert re.search(
        rf"block \(0,0,0\), thread \(0,0,0\): global-memory race: writes address "
        rf"0x[0-9a-f]+, which a cp_async_16 that thread \({issuer},0,0\) "
        rf"issued to shared address 0x[0-9a-f]+ reads, before that thread's cp_async_wait",
        message,
    ), message


@pytest.mark.parametrize("seed", [None, 6])
def test_overwriting_a_cp_async_source_after_the_wait_passes(hazards, seed):
    src = torch.arange(256, dtype=torch.float32)
    out = torch.zeros(64)
    hazards.get_function("source_overwritten").launch(1, 64, (out, src, 0), seed=seed)
    assert torch.equal(out, 4 * torch.arange(64, dtype=torch.float32))
    assert (src[::4] == -1).all()


def test_overwriting_a_bulk_copy_source_before_its_phase_completes_races(bulk):
    src = torch.randn(64)
    with pytest.raises(EmulatorError, match=r"global-memory race: writes address") as info:
        bulk.get_function("bulk_source_overwritten").launch(1, 64, (torch.zeros(64), src, 1))
    assert "which a cp_async_bulk_g2s to shared address" in str(info.value)
    src = torch.randn(64)
    want = src.clone()
    out = torch.zeros(64)
    bulk.get_function("bulk_source_overwritten").launch(1, 64, (out, src, 0), seed=2)
    assert torch.equal(out, want)


@pytest.mark.parametrize("seed", [None, 1, 2])
@pytest.mark.parametrize(
    "bug,message",
    [
        (1, r"race: (atomically updates .* which .* read|reads .* which .* updated atomically)"),
        (2, r"race: (writes .* which .* updated atomically|atomically updates .* which .* wrote)"),
    ],
    ids=["read-during-atomics", "store-during-atomics"],
)
def test_shared_atomics_mixed_with_plain_accesses_race(hazards, bug, message, seed):
    """Atomics need no order among themselves, but a plain access needs one with them (as in
    global memory)."""
    with pytest.raises(EmulatorError, match="shared-memory " + message):
        hazards.get_function("shared_count").launch(
            1, 64, (torch.zeros(64, dtype=torch.int32), bug), seed=seed
        )


@pytest.mark.parametrize("seed", [None, 1])
@pytest.mark.parametrize("bug,block", [(0, 64), (3, 32)], ids=["syncthreads", "syncwarp"])
def test_shared_atomics_then_an_ordered_read_pass(hazards, bug, block, seed):
    out = torch.zeros(64, dtype=torch.int32)
    hazards.get_function("shared_count").launch(1, block, (out, bug), seed=seed)
    assert out[0].item() == block


ATOMICS_THEN_READS = r"""
/// `atomics` 1: every thread adds to s[0] and to g[0]. 0: thread 0 adds to s[1] and g[1], and
/// thread 40 (another warp) reads s[0] and g[0], which nothing in this launch updates.
extern "C" __global__ void atomics_then_reads(int *g, int *out, int atomics) {
    __shared__ int s[2];
    if (atomics) {
        atomicAdd(&s[0], 1);
        atomicAdd(&g[0], 1);
        return;
    }
    if (threadIdx.x == 0) {
        atomicAdd(&s[1], 1);
        atomicAdd(&g[1], 1);
    }
    if (threadIdx.x == 40) out[0] = s[0] + g[0];
}
"""


def test_a_launch_forgets_the_atomics_of_the_one_before():
    """The atomics' records live apart from the other per-byte records and are kept between
    launches of a library; epochs start again at each launch, so the first launch's atomics on
    s[0] and g[0], in the same epoch number, must not race with the second's reads of them."""
    from spio.emulator import load_module

    fn = load_module(ATOMICS_THEN_READS, name="emu_test_atomics_then_reads")
    fn = fn.get_function("atomics_then_reads")
    g, out = torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    fn.launch(1, 64, (g, out, 1))
    fn.launch(1, 64, (g, out, 0))
    assert g.tolist() == [64, 1]


@pytest.mark.parametrize("seed", [None, 3])
def test_a_partial_syncwarp_orders_its_lanes_global_accesses(hazards, seed):
    """Lanes 0 and 1 load g[0], sync among themselves, and lane 0 stores: the other lanes, which
    never touched g[0], need no part in the __syncwarp (as in shared memory)."""
    g = torch.zeros(1, dtype=torch.int32)
    hazards.get_function("reader_pair_global").launch(1, 32, (g, 1), seed=seed)
    assert g.item() == 1
    with pytest.raises(EmulatorError, match=r"global-memory race: writes .* lanes of warp 0 read"):
        hazards.get_function("reader_pair_global").launch(
            1, 32, (torch.zeros(1, dtype=torch.int32), 0)
        )


@pytest.mark.parametrize("steps", [10, 400])
def test_an_mbarrier_waiter_outlasts_a_busy_producer(bulk, steps):
    """Warp 0 spins on the mbarrier while warp 1 shuffles before it arrives: no deadlock, however
    long the producer is busy."""
    x = torch.randn(4)
    out = torch.zeros(64)
    bulk.get_function("late_producer").launch(1, 64, (out, x, steps, 1))
    assert torch.equal(out[:32], x.repeat(8))


def test_an_mbarrier_no_thread_arrives_at_is_a_deadlock_after_the_others_finish(bulk):
    with pytest.raises(EmulatorError, match="mbarrier wait never ends: phase parity 0"):
        bulk.get_function("late_producer").launch(1, 64, (torch.zeros(64), torch.randn(4), 400, 0))


UNSET_ACCUMULATOR = r"""
#include <spio/warp/mma.h>
// All-ones 16x8 A and 8x8 B: every element of D is 8 plus C's. `zeroed` 0 leaves C unset.
extern "C" __global__ void ones_mma(float *out, int zeroed) {
    const unsigned ones = 0x3c003c00u;  // two fp16 ones
    const unsigned a[2] = {ones, ones};
    float c[4], d[4];
    if (zeroed) {
        for (int k = 0; k < 4; ++k) c[k] = 0.f;
    }
    spio::mma_m16n8k8_f16(d, a, ones, c);
    for (int k = 0; k < 4; ++k) out[4 * threadIdx.x + k] = d[k];
}
"""


def test_an_unset_accumulator_does_not_read_as_zeros():
    """An accumulator the kernel never zeroed read the zeros of a fresh fiber stack and gave
    exactly the right answer; checked builds now fill unset locals with a pattern
    (-ftrivial-auto-var-init=pattern, GCC 12 and clang 16), so the result is wrong and a
    comparison with a reference fails."""
    from spio.emulator import build
    from tests.emulator.conftest import load

    cxx = build.compiler()
    if not build._takes_flag(cxx, build.UNSET_LOCALS_FLAG):
        pytest.skip(f"{cxx} does not take {build.UNSET_LOCALS_FLAG} (GCC 12 or newer does)")
    module = load(UNSET_ACCUMULATOR, "emu_test_unset_accumulator")
    out = torch.full((128,), float("nan"))
    module.get_function("ones_mma").launch(1, 32, (out, 1))
    assert torch.equal(out, torch.full((128,), 8.0))
    module.get_function("ones_mma").launch(1, 32, (out, 0))
    assert not torch.isclose(out, torch.tensor(8.0)).any(), out[:4]


UNSET_SHARED = r"""
// Each thread reads its own element of a (dynamic) shared buffer, filled first unless `fill` is
// 0; the max() with 0 turns the 0xff poison (a NaN) into a plausible 0.
extern "C" __global__ void unset_shared(float *out, int fill) {
    extern __shared__ float buf[];
    if (fill) buf[threadIdx.x] = float(threadIdx.x);
    __syncthreads();
    const float v = buf[threadIdx.x];
    out[threadIdx.x] = v > 0.f ? v : 0.f;
}
"""


def test_a_read_of_shared_memory_never_written_is_reported():
    """A byte of dynamic shared memory (all spio's kernels use) that no thread of the block wrote
    read its 0xff poison: where the kernel's arithmetic hid it (a max, an integer use), nothing
    was reported, and results looked right."""
    from tests.emulator.conftest import load

    module = load(UNSET_SHARED, "emu_test_unset_shared")
    out = torch.full((64,), -1.0)
    module.get_function("unset_shared").launch(1, 64, (out, 1), shared_mem_bytes=256)
    assert torch.equal(out, torch.arange(64.0))
    with pytest.raises(
        EmulatorError,
        match=r"reads shared address .* \(offset \d+ of the block's "
        r"shared memory\), which no thread of this block has written",
    ) as info:
        module.get_function("unset_shared").launch(1, 64, (out, 0), shared_mem_bytes=256)
    assert "unset_shared" in str(info.value) and "uninitialised shared memory" in str(info.value)
