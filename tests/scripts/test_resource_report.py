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
