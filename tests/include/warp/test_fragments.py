"""Fragment row/col tables vs the PTX ISA, ldmatrix composition, register packing (host g++)."""


def test_fragment_layouts_match_ptx_isa(build_and_run):
    out = build_and_run("fragments_layout")
    assert out.strip().endswith("0 failures")
