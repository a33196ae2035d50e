"""GPU kernel tests compile their kernels up front, in parallel, so each test only launches."""

import pytest


def gpu_test_kernels(items) -> tuple[dict, list[str]]:
    """The kernels the collected `cuda` kernel tests (`params` and `config` in their callspec;
    `config` a config or its encoded name) will launch, by name, and the test ids whose kernel
    could not be made, with why."""
    from spio.kernels.families import FAMILY_OF_PASS

    kernels, failures = {}, []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if item.get_closest_marker("cuda") is None or callspec is None:
            continue
        params, config = callspec.params.get("params"), callspec.params.get("config")
        if params is None or config is None:
            continue
        family = FAMILY_OF_PASS[callspec.params.get("pass_", "wgrad")]
        try:
            if isinstance(config, str):
                config = family.config_named(params, config)
            kernel = family.make_kernel(params, config)
        except Exception as error:  # the test itself will fail on it; the others still run
            failures.append(f"{item.nodeid}: {type(error).__name__}: {error}")
            continue
        kernels[kernel.name] = kernel
    return kernels, failures


@pytest.fixture(scope="session")
def gpu_kernels_compiled(request):
    """Compile every kernel the collected `cuda` kernel tests will launch, for this GPU's arch,
    with the parallel compile pool; the tests then find their cubins in the disk cache."""
    import torch

    from spio.compiler import arch_of, compile_many

    arch = arch_of(torch.cuda.get_device_capability())
    kernels, _ = gpu_test_kernels(request.session.items)
    compile_many([k.compile_job(arch) for k in kernels.values()], desc="compiling GPU test kernels")
