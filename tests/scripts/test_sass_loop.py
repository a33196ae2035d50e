"""scripts/sass_loop.py: its arguments, the configs it picks, and a comparison against an ablate
variant on a real cubin (where nvdisasm is installed)."""

import pytest

from spio.compiler.sass import find_nvdisasm
from tests.conftest import load_script

sass_loop = load_script("sass_loop")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--sample", "0"], "--sample needs a positive count, got 0"),
        (["--sample", "3", "--config", "g2_p32_q64_n4_w4_s6_k8"], "--sample and --config"),
        (["--against", "no-such-variant"], "invalid choice"),
        (["--against", "full"], "invalid choice"),  # full is the kernel itself
        # an arch without known per-SM limits: a usage error, not a KeyError after compiling
        (["--arch", "sm_75"], "argument --arch: invalid choice: 'sm_75'"),
        (["--arch", "sm_100"], "argument --arch: invalid choice: 'sm_100'"),
        (["--batch", "0"], "argument --batch: needs a positive integer, got '0'"),
    ],
)
def test_bad_arguments_name_the_problem(argv, message, capsys):
    with pytest.raises(SystemExit):
        sass_loop.parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_sample_is_drawn_from_every_config_of_the_layers_and_repeats_with_its_seed():
    from spio.bench.layers import layer_table
    from spio.kernels.families import FAMILIES

    families = [FAMILIES["conv2d_gw8_wgrad"], FAMILIES["conv2d_gw8_fprop"]]
    layers = [layer.params(32, "fp16") for layer in layer_table()[:3]]
    args = sass_loop.parse_args(["--sample", "20", "--seed", "5"])
    cases = sass_loop.choose_cases(args, families, layers)
    assert len(cases) == 20
    for family, params, config in cases:
        assert family in families and params in layers and config in family.configs(params)
    assert len({(f.name, p.encode(), c.encode()) for f, p, c in cases}) == 20
    again = sass_loop.choose_cases(args, families, layers)
    other = sass_loop.choose_cases(sass_loop.parse_args(["--sample", "20"]), families, layers)
    assert [(f, p, c) for f, p, c in again] == cases
    assert other != cases
    # Without --sample: each layer's heuristic config, or the configs named.
    default = sass_loop.choose_cases(sass_loop.parse_args([]), families[:1], layers)
    assert [c for _, _, c in default] == [families[0].default_config(p) for p in layers]
    # For --arch, the pick for a typical GPU of that arch, as resource_report makes it (it was
    # the H200's whatever the arch): on sm_86 WGrad's of 64c 64x64 at N = 128 differs.
    from spio.kernels.conv2d_gw8_factory import typical_machine

    wgrad = [FAMILIES["conv2d_gw8_wgrad"]]
    big = [layer.params(128, "fp16") for layer in layer_table() if layer.name == "64c_64x64_3x3"]
    ((_, _, on_86),) = sass_loop.choose_cases(sass_loop.parse_args(["--arch", "sm_86"]), wgrad, big)
    assert on_86 == wgrad[0].default_config(big[0], machine=typical_machine("sm_86"))
    assert on_86 != wgrad[0].default_config(big[0])
    # A sample larger than the configs there are takes them all.
    args = sass_loop.parse_args(["--sample", "99999"])
    every = sass_loop.choose_cases(args, families, layers[:1])
    assert len(every) == sum(len(f.configs(layers[0])) for f in families)


def test_a_bad_layer_is_named():
    with pytest.raises(SystemExit, match=r"sass_loop: --layer 'n128_c64': "):
        sass_loop.main(["--layer", "n128_c64"])


def test_cells_show_the_old_value_only_when_there_is_one():
    assert sass_loop.cell(None, 132.0, 13, ".1f") == "        132.0"
    assert sass_loop.cell(150.0, 132.0, 13, ".1f") == " 150.0->132.0"
    assert sass_loop.cell(13, 12, 7) == " 13->12"


@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
def test_against_a_variant_compares_each_kernel_and_sums_up(capsys, monkeypatch):
    """WGrad's predicated copies against `copy-branch` (the branch they replaced) on the 64c
    64x64 layer: the line shows both builds' counts, and the summary says the step got shorter."""
    monkeypatch.setenv("SPIO_TMA", "off")  # copy-branch changes the cp.async copies
    code = sass_loop.main(
        [
            "--family", "conv2d_gw8_wgrad", "--against", "copy-branch",
            "--layer", "n128_c64_h64_w64_pad1x1_r3_s3_bias0_fp16",
            "--config", "g2_p32_q64_n4_w4_s6_k8",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    line = next(row for row in out.splitlines() if row.startswith("conv2d_gw8_wgrad "))
    words = line.split()
    regs, blocks, steps = words[3], words[4], words[5]
    assert "->" in regs and "->" in blocks
    before, after = (float(x) for x in steps.split("->"))
    assert after < before
    assert words[6:8] == ["24.0", "20.0"]  # the same mma and ldmatrix
    assert "against copy-branch: instructions a step a median" in out
    assert "of copy-branch's" in out
    assert "(from" in out and "0 of 1 rose" in out


def test_each_kernel_is_built_as_spio_runs_it_on_the_arch(monkeypatch, capsys):
    """With SPIO_TMA set, the kernel counted on sm_90 is the tensor-copy one spio runs there (and
    its full-step build too), on sm_86 the cp.async one."""
    import spio.compiler

    built = {}

    def compile_many(batch, **k):
        for job in batch:
            built.setdefault(job.arch, []).append(job.name.removesuffix(".cu"))
        raise SystemExit("stop after recording")

    monkeypatch.setenv("SPIO_TMA", "loads")
    monkeypatch.setattr(spio.compiler, "compile_many", compile_many)
    case = ["--family", "conv2d_gw8_fprop", "--layer", "n128_c64_h64_w64_pad1x1_r3_s3_bias0_fp16"]
    for arch in ("sm_86", "sm_90"):
        with pytest.raises(SystemExit, match="stop after recording"):
            sass_loop.main([*case, "--arch", arch])
    assert built["sm_90"] and all("__tma" in name for name in built["sm_90"]), built
    assert built["sm_86"] and not any("__tma" in name for name in built["sm_86"]), built
