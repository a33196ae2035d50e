"""scripts/resource_report.py's instructions-per-step cell, without nvdisasm or a build."""

import importlib.util
import pathlib

from spio.compiler import CompileResult

_path = pathlib.Path(__file__).parents[2] / "scripts" / "resource_report.py"
_spec = importlib.util.spec_from_file_location("resource_report", _path)
resource_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resource_report)


def test_step_cell_says_why_a_kernel_was_not_counted():
    assert resource_report._steps(CompileResult(cubin=b"", arch="sm_90"), None) == "–"
    assert resource_report._steps(ValueError("ptxas died"), None) == "not counted: ptxas died"
