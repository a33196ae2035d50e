"""The compute-sanitizer launch list (spio.bench.sanitize), without a GPU."""


def test_sanitizer_launches_include_multi_image_blocks():
    """Each pass on three layers, then each pass's blocks of several images over a batch they
    do not divide: the ragged builds, FProp and DGrad two images a block, WGrad four."""
    from spio.bench import sanitize
    from spio.kernels.families import FAMILY_OF_PASS

    launches = sanitize.launches()
    assert len(launches) == 3 * 3 + 3
    multi = [(p, pass_, c) for p, pass_, c in launches if c.block_n > 1]
    assert [(pass_, c.block_n) for _, pass_, c in multi] == [
        ("fprop", 2),
        ("dgrad", 2),
        ("wgrad", 4),
    ]
    assert all(p.n % c.block_n for p, _, c in multi)
    assert all("__ragged" in FAMILY_OF_PASS[pass_].make_kernel(p, c).name for p, pass_, c in multi)


def test_sanitizer_layers_are_the_edge_cases_it_names():
    """Bias; padding past the filter (negative DGrad padding) in bf16; 5 groups under a 5x2
    filter. An fp16-only list would leave bf16 loads and stores unchecked."""
    from spio.bench.sanitize import LAYERS

    assert any(layer.has_bias for layer in LAYERS)
    assert [layer.dtype for layer in LAYERS if layer.padding[0] > layer.r] == ["bf16"]
    assert any((layer.c // 8, layer.r, layer.s) == (5, 5, 2) for layer in LAYERS)


def test_sanitizer_run_reports_every_launch_and_fails_on_an_error_or_a_wrong_result(
    monkeypatch, capsys
):
    """main() on a faked GPU with stand-in results: an error up to the tolerance is ok, above it
    WRONG; an exception is an ERROR line and the run goes on; any of them is exit 1."""
    import torch

    from spio import check
    from spio.bench import sanitize

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    launches = sanitize.launches()
    outcomes = []

    def run_one(params, pass_, config, device):
        assert device == "cuda"
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(check, "run_one", run_one)
    outcomes[:] = [1.0, 0.25, RuntimeError("illegal address"), 1.5] + [0.5] * (len(launches) - 4)
    assert sanitize.main() == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [
        f"{pass_} {params.encode()} {config.encode()}" for params, pass_, config in launches
    ]
    assert [line.split(": ", 1)[1] for line in lines[:5]] == [
        "ok (error 1 of tolerance)",
        "ok (error 0.25 of tolerance)",
        "ERROR illegal address",
        "WRONG (error 1.5 of tolerance)",
        "ok (error 0.5 of tolerance)",
    ]
    outcomes[:] = [0.5] * (len(launches) - 1) + [RuntimeError("out of bounds")]
    assert sanitize.main() == 1
    outcomes[:] = [0.5] * len(launches)
    assert sanitize.main() == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sanitize.main() == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
