"""scripts/timm_benchmark.py: argument parsing, and a clear non-zero exit without a GPU or timm."""

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_script

SCRIPT = REPO / "scripts" / "timm_benchmark.py"


@pytest.fixture(scope="module")
def bench():
    return load_script("timm_benchmark")


def test_parse_args(bench):
    args = bench.parse_args(
        "--model regnetx_002 --spio --amp-dtype float16 --channels-last --bench train "
        "--batch-size 32 --img-size 160".split()
    )
    assert args.model == "regnetx_002" and args.spio and args.channels_last
    assert not args.spio_where_faster
    assert bench.parse_args(["--model", "m", "--spio-where-faster"]).spio_where_faster
    assert (args.amp_dtype, args.bench, args.batch_size, args.img_size) == (
        "float16",
        "train",
        32,
        160,
    )
    defaults = bench.parse_args(["--model", "resnet18"])
    assert not defaults.spio and not defaults.channels_last
    assert (defaults.amp_dtype, defaults.bench) == ("bfloat16", "inference")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--model", "m", "--amp-dtype", "float32"],
        ["--model", "m", "--bench", "eval"],
        ["--model", "m", "--batch-size", "0"],
    ],
)
def test_bad_arguments_exit_2(bench, argv, capsys):
    with pytest.raises(SystemExit) as info:
        bench.parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_steps_run_the_model_in_its_mode_and_drop_the_gradients(bench):
    """Inference steps run an eval-mode model; training steps a train-mode one, and each leaves
    no gradients behind (the next step would add to them). On the CPU, autocast("cuda") is off."""
    import warnings

    import torch

    model, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast("cuda") without CUDA warns and does nothing
        bench._step_fn(model, bench.parse_args(["--model", "m"]), x)()
        assert not model.training
        bench._step_fn(model, bench.parse_args(["--model", "m", "--bench", "train"]), x)()
    assert model.training and all(p.grad is None for p in model.parameters())


def test_missing_gpu_or_timm_exits_non_zero_with_message(bench, capsys):
    missing = bench.missing_requirements()
    if not missing:
        pytest.skip("this machine has a GPU and timm: the benchmark would run")
    assert bench.main(["--model", "resnet18", "--spio"]) == 2
    err = capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in err
    if importlib.util.find_spec("timm") is None:
        assert "needs timm" in err


def test_script_exit_status():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "resnet18"], capture_output=True, encoding="utf-8"
    )
    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("timm") is not None:
        pytest.skip("this machine has a GPU and timm: the benchmark would run")
    assert proc.returncode == 2
    assert "timm_benchmark needs" in proc.stderr
