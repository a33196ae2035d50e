"""scripts/ablate_kernel.py on CPU: every ablation variant of every pass compiles without spills,
really removes work, and leaves the production kernels untouched; no GPU gives exit status 1."""

import dataclasses
import importlib.util
import pathlib
import sys

import pytest

_path = pathlib.Path(__file__).parents[2] / "scripts" / "ablate_kernel.py"
_spec = importlib.util.spec_from_file_location("ablate_kernel", _path)
ablate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ablate
_spec.loader.exec_module(ablate)


@pytest.fixture(scope="module")
def base_kernels():
    from spio.bench.layers import layer_table
    from spio.kernels.families import FAMILY_OF_PASS

    params = layer_table()[0].params(4, "fp16")
    return {p: f.make_kernel(params, f.default_config(params)) for p, f in FAMILY_OF_PASS.items()}


def test_variants_compile_without_spills_and_remove_work(base_kernels):
    from spio.compiler import compile_many

    kernels = {
        (pass_, name): ablate.ablated(kernel, switches)
        for pass_, kernel in base_kernels.items()
        for name, switches in ablate.VARIANTS.items()
    }
    results = compile_many([k.compile_job("sm_90") for k in kernels.values()], progress=False)
    by_key = dict(zip(kernels, results, strict=True))
    for key, result in by_key.items():
        assert not isinstance(result, BaseException), (key, result)
        assert not any(r.spills for r in result.resources.values()), key
    for pass_ in base_kernels:
        full = len(by_key[(pass_, "full")].cubin)
        # Switching off the loads or the tensor-core work must shrink the code.
        assert len(by_key[(pass_, "no-loads")].cubin) < full
        assert len(by_key[(pass_, "no-mma")].cubin) < full
        assert len(by_key[(pass_, "skeleton")].cubin) < len(by_key[(pass_, "no-mma")].cubin)


def test_ablation_is_a_new_kernel_and_production_is_unchanged(base_kernels):
    kernel = base_kernels["fprop"]
    before = dataclasses.replace(kernel)
    variant = ablate.ablated(kernel, ("SPIO_ABLATE_LOADS", "SPIO_ABLATE_MMA"))
    assert ablate.ablated(kernel, ()) is kernel
    assert variant.name == kernel.name + "__ablate_loads_mma" and variant != kernel
    assert "#define SPIO_ABLATE_LOADS 1" in variant.headers[0][1]
    assert kernel == before and "SPIO_ABLATE" not in kernel.headers[0][1]
    source = kernel.source
    assert "#define SPIO_ABLATE_LOADS 0" in source  # off unless a header turns it on


def test_without_a_gpu_it_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert ablate.main([]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
