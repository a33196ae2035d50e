"""spio ships type information (spio/py.typed; spio/cuda/driver.pyi for the Cython extension):
mypy passes on the package and on user code that calls the public API as README.md shows it, and
reports a wrong call of it. Needs mypy and the stub packages of the `test` extra."""

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("mypy")

# Written as README.md shows the API, never run: mypy only reads it. assert_type fails where a
# type is wrong, and also where it is Any (a name mypy could not see, e.g. a lazy one).
USER_CODE = """\
from collections.abc import Callable

import torch
from torch import nn
from typing_extensions import assert_type

import spio
from spio.kernels import Conv2dGw8Params, Conv2dStats
from spio.kernels.kernel import Kernel
from spio.layers import Conv2dGw8


def train(model: nn.Module, x: torch.Tensor) -> nn.Module:
    model = spio.transform(model)
    assert_type(model, nn.Module)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        kernels = spio.precompile(model, x)
        assert_type(kernels, list[Kernel])
        spio.precompile(model, x, kwargs={"mask": None}, training=True, double_backward=True)
        spio.precompile(model, x, progress=False)
        loss = model(x).logsumexp(-1).mean()
    loss.backward()
    return model


def choose(model: nn.Module, x: torch.Tensor) -> None:
    spio.transform(model, include=lambda name, conv: not name.startswith("stages.3"))
    spio.transform(model, include=lambda name, conv: ("fprop", "dgrad"))
    spio.transform(model, include=lambda name, conv: "fprop")
    include = spio.transform.where_faster(model, x)
    assert_type(include, Callable[[str, nn.Conv2d], tuple[str, ...]])
    spio.transform(model, include=include)
    spio.transform(model, include=spio.transform.where_faster(model, x, training=False))
    assert_type(spio.untransform(model), nn.Module)
    layers = spio.scan_modules(model, x, kwargs={"mask": None})
    assert_type(layers, list[Conv2dGw8Params])


def layers() -> nn.Module:
    conv = Conv2dGw8(64, 64, 3, padding=1, groups=8, bias=False)
    assert_type(conv.spio_passes, tuple[str, ...])
    conv.spio_passes = ("fprop", "dgrad")
    conv.spio_passes = "wgrad"
    conv.spio_passes = True
    conv.spio_passes = 3
    plain = conv.to_torch_module()
    assert_type(plain, nn.Conv2d)
    again = Conv2dGw8.from_torch_module(plain, ("fprop",))
    assert_type(again, Conv2dGw8)
    same = spio.layers.Conv2dGw8(64, 64, (3, 3), padding="same", groups=8)
    assert_type(spio.layers.make_conv2d(64, 64, 7, padding=3, groups=8), nn.Conv2d)
    return nn.Sequential(conv, same)


def functional(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = spio.functional.conv2d_gw8(x, w)
    y = spio.functional.conv2d_gw8(x, w, b, padding_y=1, padding_x=1, passes=1 | 2)
    y = spio.functional.conv2d_gw8(x, w, bias=None, stride=1, padding_y=0, padding_x=0,
                                   dilation=1, groups=1, passes=7)
    assert_type(y, torch.Tensor)
    spio.functional.conv2d_gw8_backward(y, x, w, 1, 1, [True, True, False], passes=7)
    return y


def kernels(device: torch.device) -> None:
    params = Conv2dGw8Params(32, 64, 56, 56, padding=1, r=3, s=3, has_bias=False, dtype="fp16")
    params = spio.kernels.Conv2dGw8Params(8, 64, 28, 28, padding=(1, 2), r=3, s=5)
    params = Conv2dGw8Params(8, 64, 28, 28, dtype=torch.bfloat16)
    assert_type(params.padding, tuple[int, int])
    assert_type(params.dtype, str)
    assert_type(Conv2dStats(params).params, Conv2dGw8Params)
    factory = spio.kernels.conv2d_gw8_kernel_factory
    factory.configs(params)
    assert_type(factory.get_kernel(params, device), Kernel)
    spio.kernels.conv2d_gw8_wgrad_kernel_factory.get_kernel(params, device)
    archs: tuple[str, ...] = spio.supported_arch + spio.experimental_arch
    spio.logger.info("built")
"""

# Calls of the public API that mypy must reject, each on a line marked with the error code.
WRONG_CODE = """\
import torch

import spio
from spio.kernels import Conv2dGw8Params


def wrong(model: torch.nn.Module, x: torch.Tensor) -> None:
    Conv2dGw8Params(8, "64", 28, 28)  # arg-type
    Conv2dGw8Params(8, 64, 28, 28, padding=(1, 2, 3))  # arg-type
    spio.transform("resnet50")  # arg-type
    layers: list[str] = spio.scan_modules(model, x)  # assignment
    spio.layers.Conv2dGw8(64, 64, 3, groups="8")  # arg-type
"""


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> str:
    """One cache for this module's runs: the first one checks spio and torch's stubs cold."""
    return str(tmp_path_factory.mktemp("mypy_cache"))


def _mypy(cache: str, *paths: str) -> subprocess.CompletedProcess:
    """mypy, with the repository's settings, on the spio package (the repository's, not one
    installed) and `paths`."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", cache, "--python-executable", sys.executable]
        + ["spio", *paths],
        cwd=REPO,
        capture_output=True,
        encoding="utf-8",
        timeout=600,
    )


def test_spio_and_user_code_pass_mypy(tmp_path, mypy_cache):
    user = tmp_path / "user_code.py"
    user.write_text(USER_CODE, encoding="utf-8")
    result = _mypy(mypy_cache, str(user))
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_reports_wrong_calls_of_the_api(tmp_path, mypy_cache):
    wrong = tmp_path / "wrong_code.py"
    wrong.write_text(WRONG_CODE, encoding="utf-8")
    result = _mypy(mypy_cache, str(wrong))
    expected = {
        (number, line.rsplit("# ", 1)[1])
        for number, line in enumerate(WRONG_CODE.splitlines(), start=1)
        if "  # " in line
    }
    errors = re.findall(r"^(.*?):(\d+): error: .*\[([a-z-]+)\]$", result.stdout, re.MULTILINE)
    reported = {(int(number), code) for path, number, code in errors if path == str(wrong)}
    assert result.returncode == 1, result.stdout + result.stderr
    assert reported == expected, result.stdout
    assert len(errors) == len(expected), result.stdout  # none in spio itself
