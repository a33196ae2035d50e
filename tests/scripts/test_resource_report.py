"""scripts/resource_report.py's instructions-per-step cell, without nvdisasm or a build."""

from spio.compiler import CompileResult
from tests.conftest import load_script

resource_report = load_script("resource_report")


def test_step_cell_says_why_a_kernel_was_not_counted():
    assert resource_report._steps(CompileResult(cubin=b"", arch="sm_90"), None) == "–"
    assert resource_report._steps(ValueError("ptxas died"), None) == "not counted: ptxas died"
