"""Planted bugs are reported by the checked emulator, and their fixed versions pass."""

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
    with pytest.raises(EmulatorError, match="exited|exits"):
        hazards.get_function("early_exit").launch(1, 32, (torch.zeros(32, dtype=torch.int32), 1))
    out = torch.zeros(32, dtype=torch.int32)
    hazards.get_function("early_exit").launch(1, 32, (out, 0))
    assert out.tolist() == [lane ^ 1 for lane in range(32)]


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
