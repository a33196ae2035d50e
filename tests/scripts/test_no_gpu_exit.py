"""Every script that needs a CUDA GPU says so in one line and exits 2 (a setup error, as
`spio bench` and the `spio` commands do) where torch sees none; nothing is traced back."""

import pytest
import torch

from tests.conftest import load_script

GPU_SCRIPTS = {
    "ablate_kernel": [],
    "bench_launch": [],
    "bench_op_overhead": [],
    "fuzz_kernels": ["--device", "cuda"],
    "fuzz_layers": ["--device", "cuda"],
    "perf_sample": ["--csv", "{tmp}/samples.csv"],
    "read_probe": [],
    "timm_benchmark": ["--model", "regnetx_002"],
}


@pytest.mark.parametrize("name", sorted(GPU_SCRIPTS))
def test_a_gpu_script_without_a_gpu_exits_2_with_one_line(name, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [arg.format(tmp=tmp_path) for arg in GPU_SCRIPTS[name]]
    assert load_script(name).main(argv) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
