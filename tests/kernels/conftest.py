"""GPU kernel tests compile their kernels up front, in parallel, so each test only launches."""

import pytest


@pytest.fixture(scope="session")
def gpu_kernels_compiled(request):
    """Compile every kernel the collected `cuda` kernel tests will launch, for this GPU's arch,
    with the parallel compile pool; the tests then find their cubins in the disk cache."""
    import torch

    from spio.compiler import arch_of, compile_many
    from spio.kernels.families import FAMILY_OF_PASS

    arch = arch_of(torch.cuda.get_device_capability())
    jobs = {}
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.get_closest_marker("cuda") is None or callspec is None:
            continue
        params, config = callspec.params.get("params"), callspec.params.get("config")
        family = FAMILY_OF_PASS[callspec.params.get("pass_", "wgrad")]
        if params is not None and config is not None:
            kernel = family.make_kernel(params, config)
            jobs[kernel.name] = kernel.compile_job(arch)
    compile_many(list(jobs.values()), desc="compiling GPU test kernels")
