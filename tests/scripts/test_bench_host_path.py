"""scripts/bench_host_path.py on the CPU (its home: the launch stubbed, CPU tensors on the kernel
path): every case, the training step's parts included, gets a positive time. Run in a process of
its own, since the script stubs Kernel.launch for good."""

import re
import subprocess
import sys

from tests.conftest import REPO

CASES = (
    "torch.empty (a floor)",
    "torch.ops.spio.conv2d_gw8",
    "Conv2dGw8 module, no grad",
    "Conv2dGw8 module, forward + backward",
    "autograd.Function floor, fwd + bwd",
    "Conv2dGw8 module, forward with grad",
    "wrapper Layer.fprop",
    "wrapper Layer.dgrad",
    "wrapper Layer.wgrad (with bias)",
)


def test_every_case_gets_a_time():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/bench_host_path.py"),
            "--calls",
            "8",
            "--repeats",
            "1",
        ],
        capture_output=True,
        encoding="utf-8",
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case in CASES:
        match = re.search(rf"^{re.escape(case)}\s+(\d+\.\d\d)$", proc.stdout, re.MULTILINE)
        assert match and float(match.group(1)) > 0, (case, proc.stdout)
