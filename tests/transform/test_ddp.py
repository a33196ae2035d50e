"""DDP (gloo, CPU) keeps a transformed model's parameters in sync across two processes."""

import os
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_ddp_two_gloo_ranks_stay_in_sync(tmp_path):
    worker = pathlib.Path(__file__).with_name("_ddp_worker.py")
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    }
    result = tmp_path / "result.txt"
    proc = subprocess.run(
        [sys.executable, str(worker), str(tmp_path / "init"), str(result)],
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff, moved = map(float, result.read_text().split())
    assert diff == 0.0, f"ranks diverged by {diff}"
    assert moved > 0.0, "some parameter never changed: training did not run"
