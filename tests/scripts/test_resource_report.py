"""scripts/resource_report.py: its instructions-per-step cell, without nvdisasm or a build, and its
arguments, checked before any compile."""

import pytest

from spio.compiler import CompileResult
from tests.conftest import load_script

resource_report = load_script("resource_report")


def test_step_cell_says_why_a_kernel_was_not_counted():
    assert resource_report._steps(CompileResult(cubin=b"", arch="sm_90"), None) == "–"
    assert resource_report._steps(ValueError("ptxas died"), None) == "not counted: ptxas died"


@pytest.mark.parametrize("out", ["missing/report.md", "."])
def test_an_output_it_cannot_write_is_a_usage_error_before_any_compile(
    out, tmp_path, monkeypatch, capsys
):
    """A mistyped --out (a folder that does not exist, or a folder) stops the script at once
    with a usage error naming it, not with a traceback after minutes of compiles."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resource_report, "compile_many", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(SystemExit) as exit_:
        resource_report.main(["--out", out])
    assert exit_.value.code == 2
    assert f"--out {out}" in capsys.readouterr().err


def test_a_batch_size_that_is_not_positive_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(resource_report, "compile_many", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(SystemExit) as exit_:
        resource_report.main(["--n", "0"])
    assert exit_.value.code == 2
    assert "needs a positive integer, got '0'" in capsys.readouterr().err


def test_the_report_adds_what_the_shipped_models_pick_on_an_h200(monkeypatch, capsys):
    """The heuristic's picks per arch, then, where a shipped model covers the layer, the sm_90
    model's pick: what spio runs on an H200."""
    from spio.bench.layers import layer_table
    from spio.kernels import perf_model as pm
    from spio.kernels.families import FAMILIES

    layer = layer_table()[0]  # 64c 64x64 3x3
    monkeypatch.setattr(resource_report, "layer_table", lambda: [layer])
    monkeypatch.setattr(resource_report.spio, "supported_arch", ("sm_90",))
    assert resource_report.main(["--n", "128"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()]
    picked = {row[1]: row[2] for row in rows if len(row) > 3 and row[3] == "sm_90, model"}
    params = layer.params(128)
    expected = {
        name.removeprefix("conv2d_gw8_"): pm.rank_configs(
            family, params, resource_report.H200, pm.PACKAGED_MODELS_DIR
        )[0][0].encode()
        for name, family in FAMILIES.items()
    }
    assert picked == expected
    assert picked["wgrad"] != FAMILIES["conv2d_gw8_wgrad"].default_config(params).encode()


def test_each_kernel_is_built_as_spio_runs_it_on_its_arch(monkeypatch, capsys):
    """With SPIO_TMA set, the sm_90 rows (the heuristic's and the model's picks) are the
    tensor-copy kernels spio runs there, the sm_86 rows the cp.async ones."""
    from spio.bench.layers import layer_table

    jobs = []

    def compile_many(batch, **k):
        jobs.extend((job.name.removesuffix(".cu"), job.arch) for job in batch)
        return [RuntimeError("not compiled in this test")] * len(batch)

    monkeypatch.setenv("SPIO_TMA", "loads+stores")
    monkeypatch.setattr(resource_report, "layer_table", lambda: [layer_table()[0]])
    monkeypatch.setattr(resource_report.spio, "supported_arch", ("sm_86", "sm_90"))
    monkeypatch.setattr(resource_report, "compile_many", compile_many)
    resource_report.main(["--n", "128"])
    capsys.readouterr()
    newer = [name for name, arch in jobs if arch == "sm_90"]
    older = [name for name, arch in jobs if arch == "sm_86"]
    assert len(newer) > len(older) > 0  # (sm_90's model picks too)
    assert not any("__tma" in name for name in older), older
    for name in newer:  # (WGrad's full-step builds too)
        wgrad = name.startswith("conv2d_gw8_wgrad")
        name = name.removesuffix("__variant_wgrad_unmasked")
        assert name.endswith("__tma" if wgrad else "__tmaio"), name
