"""Under SPIO_EMULATOR the mma, ldmatrix and cp.async primitives call
::spio::emu::<same name>(<same args>) (host g++; host/emulator_branch.cpp records each).
thread/bulk_copy.h's (sm_90) are not recorded here: tests/emulator/test_tensor_copy.py runs them
in the emulator."""


def test_primitives_forward_to_emulator(build_and_run):
    out = build_and_run("emulator_branch")
    assert out.strip().endswith("0 failures")
