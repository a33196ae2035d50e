"""Under SPIO_EMULATOR each primitive calls ::spio::emu::<same name>(<same args>) (host g++)."""


def test_primitives_forward_to_emulator(build_and_run):
    out = build_and_run("emulator_branch")
    assert out.strip().endswith("0 failures")
