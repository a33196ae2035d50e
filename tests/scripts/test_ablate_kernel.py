"""scripts/ablate_kernel.py on CPU: every ablation variant of every pass compiles without spills,
really removes work, and leaves the production kernels untouched; no GPU gives exit status 2."""

import dataclasses
import re
import sys

import pytest

from spio.bench.layers import parse_layer
from spio.compiler.sass import find_nvdisasm
from tests.conftest import REPO, load_script

ablate = load_script("ablate_kernel")


@pytest.fixture(scope="module")
def base_kernels():
    from spio.bench.layers import layer_table
    from spio.kernels.families import FAMILY_OF_PASS

    params = layer_table()[0].params(4, "fp16")
    return {p: f.make_kernel(params, f.default_config(params)) for p, f in FAMILY_OF_PASS.items()}


def test_variants_compile_without_spills_and_remove_work(base_kernels):
    from spio.compiler import compile_many

    kernels = {
        (pass_, name): ablate.build_variant(kernel, name)
        for pass_, kernel in base_kernels.items()
        for name in [*ablate.VARIANTS, *ablate.SWIZZLED, *ablate.TMA]
        if ablate.variant_applies(name, pass_, *_params_and_config(kernel))
    }
    results = compile_many([k.compile_job("sm_90") for k in kernels.values()], progress=False)
    by_key = dict(zip(kernels, results, strict=True))
    for key, result in by_key.items():
        assert not isinstance(result, BaseException), (key, result)
        assert result.resources and not any(r.spills for r in result.resources.values()), key
    for pass_ in base_kernels:
        full = len(by_key[(pass_, "full")].cubin)
        # Switching off the loads or the tensor-core work must shrink the code.
        assert len(by_key[(pass_, "no-loads")].cubin) < full
        assert len(by_key[(pass_, "no-mma")].cubin) < full
        assert len(by_key[(pass_, "skeleton")].cubin) < len(by_key[(pass_, "no-mma")].cubin)
    for pass_ in ("fprop", "dgrad"):  # the pipeline alone: less than loads-only keeps
        for prefix in ("", "swizzled-", "tma-"):
            pipeline = len(by_key[(pass_, f"{prefix}pipeline-only")].cubin)
            assert pipeline < len(by_key[(pass_, f"{prefix}loads-only")].cubin)
    assert ("wgrad", "pipeline-only") not in by_key
    assert ("wgrad", "swizzled-pipeline-only") not in by_key
    assert ("wgrad", "swizzled") in by_key and ("wgrad", "swizzled-loads-only") in by_key
    assert ("wgrad", "tma") in by_key and ("wgrad", "tma-loads-only") in by_key
    assert ("wgrad", "tma-pipeline-only") not in by_key
    assert ("wgrad", "tma-stores") not in by_key and ("fprop", "tma-stores") in by_key
    store = "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
    assert (
        store in by_key[("dgrad", "tma-stores")].ptx and store not in by_key[("dgrad", "tma")].ptx
    )
    # WGrad's `unmasked` need not shrink the code: with one kind of step left ptxas may unroll
    # the loop further (it did once the last steps stopped branching around their copies: 792
    # against 776 instructions, NVRTC 12.9). That it leaves out the careful steps is tested by
    # what it computes (test_unmasked_wgrad_leaves_out_only_the_careful_steps).


def _params_and_config(kernel):
    return kernel.info_value("params"), kernel.info_value("config")


def test_combined_variants_are_the_union_of_their_parts():
    """As the docstring defines them: skeleton is no-loads and no-mma, loads-only no-mma and
    no-stores."""
    v = {name: set(switches) for name, switches in ablate.VARIANTS.items()}
    assert v["skeleton"] == v["no-loads"] | v["no-mma"]
    assert v["loads-only"] == v["no-mma"] | v["no-stores"]
    assert v["loads-stagger"] == v["loads-only"] | v["stagger"]
    assert v["ldg-pipeline-only"] == v["ldg"] | v["pipeline-only"]


def test_swizzled_variants_are_the_swizzled_kernel_with_their_partners_switches(base_kernels):
    """Each swizzled variant is make_kernel(swizzled=True) with the switches of the variant it
    names (loads-only's, pipeline-only's, none), under a name of its own; WGrad's keep its
    reduction (partial sums or atomics) and have no pipeline-only."""
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    for pass_, factory in (("fprop", fd), ("dgrad", fd), ("wgrad", wg)):
        kernel = base_kernels[pass_]
        swizzled = factory.with_swizzled_stages(kernel)
        assert swizzled.info_value("swizzled") and not kernel.info_value("swizzled")
        assert swizzled.info[:-1] == kernel.info[:-1]  # params, config, operands or reduction
        names = set()
        for name, partner in ablate.SWIZZLED.items():
            applies = ablate.variant_applies(name, pass_, *_params_and_config(kernel))
            assert applies == (pass_ != "wgrad" or name != "swizzled-pipeline-only")
            if applies:
                built = ablate.build_variant(kernel, name)
                assert built.headers == swizzled.with_defines(ablate.VARIANTS[partner]).headers
                names.add(built.name)
        assert len(names) == (2 if pass_ == "wgrad" else 3) and kernel.name not in names


def test_tma_variants_are_the_tma_kernel_with_their_partners_switches(base_kernels):
    """Each tma variant is make_kernel(tma=True) (tma-stores: with tma_stores too; tma-l2-*:
    with their maps' L2 promotion) with the switches of the variant it names, under a name of
    its own; WGrad's keep its reduction and have no pipeline-only, nor tensor-copy stores (its
    output is the weight gradient)."""
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    for pass_, factory in (("fprop", fd), ("dgrad", fd), ("wgrad", wg)):
        kernel = base_kernels[pass_]
        names = set()
        for name, partner in ablate.TMA.items():
            applies = ablate.variant_applies(name, pass_, *_params_and_config(kernel))
            fprop_dgrad = name in ("tma-pipeline-only", "tma-stores")
            assert applies == (pass_ != "wgrad" or not fprop_dgrad)
            if applies:
                built = ablate.build_variant(kernel, name)
                stores, l2 = name == "tma-stores", ablate.TMA_L2.get(name, 0)
                rebuilt = (
                    fd.with_tma_stages(kernel, stores)
                    if stores
                    else factory.with_tma_stages(kernel, l2=l2)
                )
                expected = rebuilt.with_defines(ablate.VARIANTS[partner])
                assert built.headers == expected.headers and built.info_value("tma")
                assert bool(built.info_value("tma_stores")) == stores
                assert built.info_value("tma_l2") == l2 and built.name == expected.name
                assert built.info[:2] == kernel.info[:2]  # params, config
                names.add(built.name)
        assert len(names) == (5 if pass_ == "wgrad" else 7) and kernel.name not in names
    assert ablate.TMA_STORES <= ablate.RIGHT_RESULTS and set(ablate.TMA_L2) <= ablate.RIGHT_RESULTS
    assert set(ablate.TMA_L2) <= set(ablate.TMA)


@pytest.mark.parametrize("variant", ["pipeline-only", "ldg-pipeline-only"])
def test_pipeline_only_copies_rows_and_writes_nothing(variant):
    """The FProp kernel with SPIO_ABLATE_COMPUTE (emulated, hazard checks on): every output
    element keeps the poison it was given (no staging, no stores), where the same config without
    it writes every one. (That its copies stay: the compile test, smaller than loads-only but
    still copying, and the GPU's times.)"""
    import torch

    from spio.check import random_inputs
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    params = Conv2dGw8Params(n=2, c=16, h=7, w=9, padding=1)
    config = dataclasses.replace(fd.default_config(params), stages=4)  # 3 divides R for ldg
    assert ablate.variant_applies(variant, "fprop", params, config)
    assert not ablate.variant_applies(variant, "wgrad", params, config)
    kernel = fd.make_kernel(params, config).with_defines(ablate.VARIANTS[variant])
    assert "#define SPIO_ABLATE_COMPUTE 1" in kernel.headers[0][1]
    t = random_inputs(params, seed=3)
    out = torch.full(params.output_shape, float("nan"), dtype=t["x"].dtype)
    out = out.contiguous(memory_format=torch.channels_last)
    y = fd.fprop(t["x"], t["w"], None, params, kernel=kernel, out=out)
    assert y.data_ptr() == out.data_ptr() and torch.isnan(y).all()
    plain = fd.fprop(t["x"], t["w"], None, params, kernel=fd.make_kernel(params, config))
    assert not torch.isnan(plain).any()


def test_ldg_applies_to_fprop_and_dgrad_configs_whose_stages_divide_r(base_kernels):
    params, config = _params_and_config(base_kernels["fprop"])
    four = dataclasses.replace(config, stages=4)
    eight = dataclasses.replace(config, stages=8)
    assert params.r == 3
    assert ablate.variant_applies("ldg", "fprop", params, four)
    assert not ablate.variant_applies("ldg-loads-only", "dgrad", params, eight)
    assert ablate.variant_applies("ldg", "wgrad", params, eight)
    assert ablate.variant_applies("stagger", "fprop", params, eight)


def test_ablation_is_a_new_kernel_and_production_is_unchanged(base_kernels):
    kernel = base_kernels["fprop"]
    before = dataclasses.replace(kernel)
    variant = kernel.with_defines(("SPIO_ABLATE_LOADS", "SPIO_ABLATE_MMA"))
    assert kernel.with_defines(()) is kernel
    assert variant.name == kernel.name + "__variant_loads_mma" and variant != kernel
    assert "#define SPIO_ABLATE_LOADS 1" in variant.headers[0][1]
    assert kernel == before and "SPIO_ABLATE" not in kernel.headers[0][1]
    # Off unless a header turns it on: the kernel takes the defaults of spio/ablation.h, after
    # the generated header (where the switches are defined).
    source = kernel.source
    assert source.index('#include "conv2d_gw8_gen.h"') < source.index('#include "spio/ablation.h"')
    from spio.cuda import paths

    defaults = (paths.bundled_include_dir() / "spio" / "ablation.h").read_text()
    assert "#ifndef SPIO_ABLATE_LOADS\n#define SPIO_ABLATE_LOADS 0" in defaults


def test_without_a_gpu_it_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert ablate.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_wgrad_reductions_time_both_wrappers_on_their_inputs(monkeypatch):
    """The atomics-versus-partial-sums comparison calls the real wrapper with each kernel (on the
    CPU emulator here; the timer is a stand-in that runs each call once)."""
    import types

    import torch

    import spio.bench.timing
    import spio.compiler
    from spio.kernels import autotune
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    ran = []
    real_wgrad = wg.wgrad
    monkeypatch.setattr(
        wg, "wgrad", lambda *a, **k: ran.append(k["kernel"].name) or real_wgrad(*a, **k)
    )
    built = []
    monkeypatch.setattr(
        spio.compiler, "compile_many", lambda jobs, **k: built.extend(j.name for j in jobs)
    )
    fake_timing = types.SimpleNamespace(median_ms=0.5)
    monkeypatch.setattr(
        spio.bench.timing, "time_calls", lambda call, warmup, reps: call(0) or fake_timing
    )
    params = Conv2dGw8Params(n=2, c=16, h=6, w=7, padding=1, r=3, s=3)
    config = wg.default_config(params)
    cpu = torch.device("cpu")
    arg_sets = [autotune.kernel_inputs("conv2d_gw8_wgrad", params, cpu, seed) for seed in (0, 1)]
    times = ablate.time_wgrad_reductions(params, config, arg_sets, "sm_90", 5)
    assert times == {"atomic+zero": 0.5e-3, "partials+sum": 0.5e-3, "sum alone": 0.5e-3}
    assert set(times) == set(ablate.REDUCTION_NOTES)
    slots = wg.partial_slots(params, config)  # read, and dw (16 x 8 x 3 x 3 floats) written
    assert ablate.sum_bytes(params, config) == 4 * (slots + 1) * 16 * 8 * 9
    assert len(ran) == 2 and not ran[0].endswith("__partials") and ran[1].endswith("__partials")
    assert built == [f"{name}.cu" for name in ran] + [f"{wg.sum_kernel(params).name}.cu"]


@pytest.mark.parametrize(
    "variant,define",
    [
        ("l2-256", "#define SPIO_L2_PREFETCH 256"),
        ("stagger", "#define SPIO_STAGGER_NS 400"),
        ("unroll-r", "#define SPIO_UNROLL_BY_R 1"),
        ("stores-cs", "#define SPIO_STORE_STREAMING 1"),
    ],
)
def test_timing_variants_build_for_every_arch_and_stay_correct(base_kernels, variant, define):
    """l2-256, stagger, unroll-r and stores-cs are not ablations (stores-cs: the output goes out
    with st.global.cs, tested in tests/include): the input copies carry the .L2::256B hint,
    blocks start late (__nanosleep), or the main loop is unrolled by R steps only, and the results
    are unchanged (the emulator ignores the first two; NVRTC must accept them on every arch)."""
    import spio
    from spio.compiler import compile_many

    kernel = base_kernels["fprop"].with_defines(ablate.VARIANTS[variant])
    assert define in kernel.headers[0][1]
    results = compile_many([kernel.compile_job(a) for a in spio.supported_arch], progress=False)
    for arch, result in zip(spio.supported_arch, results, strict=True):
        assert not isinstance(result, BaseException), (arch, result)
        assert result.resources and not any(r.spills for r in result.resources.values()), arch
    # The same results as the plain kernel (emulated, on a small layer).
    import torch

    from spio.check import random_inputs
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    # 6 stages: the production loop is unrolled by 6 steps, unroll-r's by 3; 10 input rows, so
    # the production loop's second pass stops part way.
    params = Conv2dGw8Params(n=2, c=16, h=7, w=9, padding=1, has_bias=True)
    t = random_inputs(params, seed=1)
    plain = fd.make_kernel(params, dataclasses.replace(fd.default_config(params), stages=6))
    changed = plain.with_defines(ablate.VARIANTS[variant])
    y_plain = fd.fprop(t["x"], t["w"], t["bias"], params, kernel=plain)
    y_changed = fd.fprop(t["x"], t["w"], t["bias"], params, kernel=changed)
    assert torch.equal(y_plain, y_changed) and y_plain.abs().sum() > 0


def test_unmasked_wgrad_leaves_out_only_the_careful_steps():
    """`unmasked` builds WGrad without its careful steps, and only WGrad. On finite inputs its dw
    is the production kernel's to fp32 rounding (x times zero adds exact zeros; the careful steps
    add some products in another order); with an inf in x it is non-finite at taps the float64
    reference has finite, so the switch really removes them (emulated, on a layer whose last row
    and column tiles run past the output)."""
    import torch

    from spio.check import random_inputs
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
    from spio.reference import conv2d_gw8_wgrad_ref

    params = Conv2dGw8Params(n=2, c=16, h=13, w=21, padding=0)
    config = wg.default_config(params)
    assert ablate.variant_applies("unmasked", "wgrad", params, config)
    assert not ablate.variant_applies("unmasked", "fprop", params, config)
    plain = wg.production_kernel(params, config)
    unmasked = plain.with_defines(ablate.VARIANTS["unmasked"])
    assert "#define SPIO_WGRAD_UNMASKED 1" in unmasked.headers[0][1]
    t = random_inputs(params, seed=2)
    dw_plain, _ = wg.wgrad(t["x"], t["dy"], params, kernel=plain)
    dw_unmasked, _ = wg.wgrad(t["x"], t["dy"], params, kernel=unmasked)
    torch.testing.assert_close(dw_unmasked, dw_plain, rtol=1e-6, atol=1e-5)
    assert dw_plain.abs().sum() > 0
    x = t["x"].clone()
    x[0, 1, params.h - 1, params.w - 1] = float("inf")
    expected_finite = torch.isfinite(conv2d_gw8_wgrad_ref(x, t["dy"], 0, 3, 3))
    plain_finite = torch.isfinite(wg.wgrad(x, t["dy"], params, kernel=plain)[0])
    assert torch.equal(plain_finite, expected_finite)
    spread = ~torch.isfinite(wg.wgrad(x, t["dy"], params, kernel=unmasked)[0]) & expected_finite
    assert spread.any()


def test_copy_branch_wgrad_builds_everywhere_and_gives_the_same_dw():
    """`copy-branch` builds WGrad with its row copies under branches, as before they were
    predicated and the last steps copied zeros, and only WGrad: NVRTC accepts it on every arch,
    and dw is bit for bit the production kernel's (emulated, on a layer where only some threads
    copy a second x element per row, and whose blocks of 4 images have steps past their last
    that now copy zeros). tests/compiler/test_sass.py compares the two loops."""
    import torch

    import spio
    from spio.check import random_inputs
    from spio.compiler import compile_many
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
    from spio.kernels.families import FAMILY_OF_PASS

    # 4 images per block, 5 images; 68 x elements a row for 64 threads: 4 copy a second one.
    params = Conv2dGw8Params(n=5, c=16, h=9, w=35, padding=1, has_bias=True)
    config = FAMILY_OF_PASS["wgrad"].config_named(params, "g2_p4_q32_n4_w4_s6_k8")
    assert ablate.variant_applies("copy-branch", "wgrad", params, config)
    assert not ablate.variant_applies("copy-branch", "dgrad", params, config)
    plain = wg.production_kernel(params, config)
    assert re.search(r"class XLoadIdx.*?static constexpr int size = 68;", plain.headers[0][1], re.S)
    assert plain.threads == 64
    branch = plain.with_defines(ablate.VARIANTS["copy-branch"])
    assert "#define SPIO_COPY_UNDER_BRANCH 1" in branch.headers[0][1]
    results = compile_many([branch.compile_job(a) for a in spio.supported_arch], progress=False)
    for arch, result in zip(spio.supported_arch, results, strict=True):
        assert not isinstance(result, BaseException), (arch, result)
        assert result.resources and not any(r.spills for r in result.resources.values()), arch
    t = random_inputs(params, seed=3)
    dw_plain, db_plain = wg.wgrad(t["x"], t["dy"], params, kernel=plain)
    dw_branch, db_branch = wg.wgrad(t["x"], t["dy"], params, kernel=branch)
    assert torch.equal(dw_plain, dw_branch) and torch.equal(db_plain, db_branch)
    assert dw_plain.abs().sum() > 0


def test_config_names_come_from_the_space_or_the_trial_configs(capsys):
    """--config takes a layer's configs and its trial ones (saying so); a name the layer has
    neither of is an error naming it."""
    from spio.kernels.families import FAMILY_OF_PASS

    params = parse_layer("64c_64x64_3x3").params(128, "fp16")
    family = FAMILY_OF_PASS["wgrad"]
    names = ["g2_p64_q32_n1_w4_s2_k16", "g2_p64_q64_n1_w8_s2_k16"]
    configs = ablate.named_configs(family, params, names)
    assert [c.encode() for c in configs] == names and configs[1] not in family.configs(params)
    out = capsys.readouterr().out
    assert "g2_p64_q64_n1_w8_s2_k16: a trial config" in out and "w4" not in out
    assert ablate.named_configs(family, params, [names[0], "g2_p64_q64_n1_w16_s2_k16"]) is None
    assert "wgrad: no config g2_p64_q64_n1_w16_s2_k16 for this layer" in capsys.readouterr().err
    assert ablate.named_configs(FAMILY_OF_PASS["fprop"], params, [names[1]]) is None


def _gpu_check_ablate_calls() -> list[list[str]]:
    """The arguments of every `ablate ...` call in scripts/gpu_check.sh's ablate step."""
    import shlex

    text = (REPO / "scripts" / "gpu_check.sh").read_text(encoding="utf-8")
    body = text[text.index("step_ablate() {") :]
    body = body[: body.index("\n}\n")].replace("\\\n", " ")
    # (a call may set variables first: CAP=60 ablate --...)
    calls = [
        re.fullmatch(r"(?:[A-Z_]+=\S+ )*ablate (--.*)", line.strip()) for line in body.splitlines()
    ]
    return [shlex.split(call.group(1)) for call in calls if call]


def test_gpu_check_ablates_only_layers_passes_and_configs_that_exist():
    """A config name the config space no longer has makes its whole line of the GPU run exit 2
    (and the run is rare): every call of the script's ablate step must parse, and every --config
    it names must exist for each of its layers and passes (in the space or on trial)."""
    from spio.bench.layers import layer_table
    from spio.kernels.families import FAMILY_OF_PASS

    calls = _gpu_check_ablate_calls()
    assert len(calls) >= 4, calls
    table_names = " ".join(layer.name for layer in layer_table())
    checked = 0
    for argv in calls:
        argv = [a for word in argv for a in (table_names.split() if word == "$layers" else [word])]
        args = ablate.parse_args(["--n", "128", *argv])
        for text in args.layer:
            params = parse_layer(text).params(args.n, args.dtype)
            for pass_ in args.passes:
                family = FAMILY_OF_PASS[pass_]
                names = {c.encode() for c in family.configs(params) + family.trial_configs(params)}
                missing = sorted(set(args.config or ()) - names)
                assert not missing, f"gpu_check: {text} {pass_} has no config {missing}"
                checked += len(args.config or ())
    assert checked > 0


def _kernels_of_call(argv: list[str], layers: int) -> int:
    """Kernels one ablate call builds and times (an upper bound: ldg's variants may not apply),
    with the WGrad wrapper's two reduction kernels per config."""
    args = ablate.parse_args(["--n", "128", *argv])
    count = len(args.layer) - 1 + layers if "$layers" in argv else len(args.layer)
    variants = set(args.variants) | {"full"}
    total = 0
    for pass_ in args.passes:
        if pass_ == "wgrad":  # FProp/DGrad's own variants (pipeline-only, tma) are not built
            per_config = 2 + sum(ablate.variant_applies(v, pass_, None, None) for v in variants)
        else:
            per_config = len(variants)
        total += count * len(args.config or [None]) * per_config
    return total


def test_gpu_check_ablate_step_names_its_variants_and_puts_the_wanted_parts_first():
    """The step has 200 s for a few processes: no line times every variant (a compile each, a
    config), and the whole step builds under 160 kernels (run 6 built 236 of its 281 before its
    time ran out: docs/perf/2026-12-04-h200.md). The headline layer's ablation, with FProp's
    input pipeline alone, the swizzled stages and the tensor copies (FProp/DGrad's stores by
    them too), comes first (the reference each run compares against); every layer's kernels
    swizzled and not, with the settled WGrad reductions, come last; what runs 6 to 8 settled is
    left out."""
    from spio.bench.layers import layer_table

    calls = _gpu_check_ablate_calls()
    assert all("--variants" in argv for argv in calls), [a for a in calls if "--variants" not in a]
    total = sum(_kernels_of_call(argv, len(layer_table())) for argv in calls)
    assert total < 160, total
    args = [ablate.parse_args(["--n", "128", *argv]) for argv in calls]
    assert calls[0][:2] == ["--layer", "64c_64x64_3x3"] and "--passes" not in calls[0]
    assert not args[0].config
    assert {"no-stores", "no-loads", "skeleton", "pipeline-only"} <= set(args[0].variants)
    # Last, every layer: each pass swizzled against group-major (and WGrad's reductions); the
    # swizzled stages also in the headline layer's ablation, kernel and pipeline alone.
    assert "$layers" in calls[-1] and args[-1].variants == ["full", "swizzled"]
    assert args[-1].passes == ["fprop", "dgrad", "wgrad"]
    assert {"swizzled", "swizzled-loads-only", "swizzled-pipeline-only"} <= set(args[0].variants)
    # Tensor copies (never run on a GPU before) in a process of their own, on the same layer,
    # with a time cap of their own (a copy that never lands would hang the process).
    text = (REPO / "scripts" / "gpu_check.sh").read_text(encoding="utf-8")
    assert "CAP=75 ablate --layer 64c_64x64_3x3 --variants full tma " in text
    assert calls[1][:2] == ["--layer", "64c_64x64_3x3"] and "--passes" not in calls[1]
    assert set(args[1].variants) == {"full", *ablate.TMA} - {"tma-l2-256"}
    assert not any(v.startswith("tma") for a in args[:1] + args[2:] for v in a.variants if a)
    assert all("$layers" not in argv for argv in calls[:-1])
    # Settled by run 6, left out: FProp's unroll-r, WGrad's unmasked and copy-branch on every
    # layer, stagger (DRAM camping), several images per block on the small layers; by run 7: the
    # L2 prefetch hint, streaming stores, rows through registers in the full kernel, the per-row
    # barrier.
    named = {v for a in args for v in a.variants} | {c for a in args for c in a.config or ()}
    settled = {"unroll-r", "unmasked", "copy-branch", "stagger", "loads-stagger", "l2-256"}
    settled |= {"no-sync"}
    assert not named & (settled | {"stores-cs", "ldg", "ldg-loads-only"})
    assert not any(c.endswith(("_n2", "_n4", "_n8")) for c in named)


def test_the_rate_column_says_it_is_the_pass_bytes_over_each_lines_time(capsys):
    """Every line divides the full pass's bytes by its own time: the column is "pass GB/s", and
    the help and docstring say so (loads-only had read "3294 GB/s" as if it moved those bytes)."""
    line = ablate.row("fprop", "loads-only", 40e-6, 132_000_000, 50e-6, "g8_p64_q64_w2_s4_k16")
    assert line.split() == ["fprop", "loads-only", "40.0", "3300", "0.80", "g8_p64_q64_w2_s4_k16"]
    assert "pass GB/s" in ablate.__doc__
    with pytest.raises(SystemExit):
        ablate.parse_args(["--help"])
    assert "pass GB/s: the full pass's bytes over that time" in " ".join(
        capsys.readouterr().out.split()
    )


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU standing in on the CPU for ablate_layer: the compile batches' sizes and the names
    of the kernels timed, in order, go into the list returned."""
    import types

    import torch

    import spio.bench.run
    import spio.bench.timing
    import spio.compiler
    import spio.cuda
    from spio.kernels import autotune
    from spio.kernels import perf_model as pm

    events = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fake_driver = types.SimpleNamespace(
        device_attributes=lambda i: {"name": "GPU", "arch": "sm_90", "l2_cache_bytes": 0}
    )
    monkeypatch.setattr(spio.cuda, "driver", fake_driver, raising=False)
    monkeypatch.setitem(sys.modules, "spio.cuda.driver", fake_driver)

    def compile_many(jobs, **kwargs):
        events.append(len(jobs))
        broken = RuntimeError("did not build")  # the no-mma variant's
        return [broken if "__variant_mma." in job.name else None for job in jobs]

    monkeypatch.setattr(spio.compiler, "compile_many", compile_many)
    monkeypatch.setattr(autotune, "kernel_inputs", lambda *a: [])
    h200 = pm.DeviceIdentity("sm_90", "NVIDIA H200", "13.0", sms=132)
    monkeypatch.setattr(pm, "device_identity", lambda device: h200)

    def time_kernel(family, params, kernel, *args, **kwargs):
        events.append(kernel.name)
        return 1e-5

    monkeypatch.setattr(autotune, "time_kernel", time_kernel)
    monkeypatch.setattr(ablate, "time_wgrad_reductions", lambda *a: {})
    monkeypatch.setattr(ablate, "result_of", lambda *a: torch.zeros(1))  # every variant agrees
    pair = [(torch.zeros(8), torch.zeros(8))]
    monkeypatch.setattr(spio.bench.run, "copy_pairs", lambda *a: pair)
    timing = types.SimpleNamespace(median_ms=0.01)
    monkeypatch.setattr(spio.bench.timing, "time_calls", lambda *a, **k: timing)
    return events


def test_a_layers_kernels_compile_in_one_batch_before_any_is_timed(fake_gpu):
    """Every variant of every pass and config is compiled in one parallel batch, then timed
    (one batch per config had left most compile workers idle)."""
    events = fake_gpu
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "2", "--passes", "fprop", "dgrad",
         "--config", "g8_p64_q64_w2_s4_k16", "g8_p64_q16_w1_s4_k16",
         "--variants", "full", "no-loads", "loads-only"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 0
    timed = events[1:]
    assert events[0] == len(timed) == 2 * 2 * 3  # passes x configs x variants, compiled first
    assert all(isinstance(name, str) for name in timed)


@pytest.mark.parametrize("gpu", ["H200", "RTX 3090"])
def test_heuristic_times_the_config_gpus_without_a_model_run(fake_gpu, monkeypatch, gpu):
    """--heuristic times each pass's analytic-heuristic config for this GPU, spio's choice
    where no performance model applies (it timed the H200's pick on every GPU: on an RTX 3090
    WGrad's differs at N = 128); it and --config exclude each other."""
    from spio.kernels import perf_model as pm
    from spio.kernels.families import FAMILY_OF_PASS

    identity = {
        "H200": pm.DeviceIdentity("sm_90", "NVIDIA H200", "13.0", sms=132),
        "RTX 3090": pm.DeviceIdentity("sm_86", "NVIDIA GeForce RTX 3090", "13.0", sms=82),
    }[gpu]
    monkeypatch.setattr(pm, "device_identity", lambda device: identity)
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "128", "--passes", "fprop", "wgrad", "--heuristic",
         "--variants", "full", "unroll-r"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 0
    params = parse_layer("64c_64x64_3x3").params(128, "fp16")
    fprop, wgrad = (
        FAMILY_OF_PASS[p].default_config(params, machine=identity.machine).encode()
        for p in ("fprop", "wgrad")
    )
    h200_wgrad = FAMILY_OF_PASS["wgrad"].default_config(params).encode()
    assert (wgrad == h200_wgrad) == (gpu == "H200")
    timed = fake_gpu[1:]
    assert len(timed) == 3  # unroll-r is FProp's alone
    # Compiled first, with the sum that a partials WGrad's timed calls run.
    assert fake_gpu[0] == 3 + timed[-1].endswith("__partials")
    assert timed[0].endswith(f"__{fprop}")
    assert timed[1] == f"{timed[0]}__variant_unroll_by_r"
    assert f"__{wgrad}" in timed[2] and "variant" not in timed[2]
    with pytest.raises(SystemExit):
        ablate.parse_args(["--heuristic", "--config", "g8_p64_q64_w2_s4_k16"])


def test_every_line_is_timed_against_full_timed_first(fake_gpu, monkeypatch, capsys):
    """full is timed first even when --variants lists it later, and each line's "vs full" is its
    time over full's."""
    from spio.kernels import autotune

    def time_kernel(family, params, kernel, *args, **kwargs):
        fake_gpu.append(kernel.name)
        return 1e-5 if "__variant_" in kernel.name else 4e-5

    monkeypatch.setattr(autotune, "time_kernel", time_kernel)
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "2", "--passes", "fprop", "--heuristic",
         "--variants", "no-loads", "full"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    rows = [(w[1], w[2], w[4]) for w in lines if w[:1] == ["fprop"] and w[1] != "variant"]
    assert rows[:2] == [("full", "40.0", "1.00"), ("no-loads", "10.0", "0.25")]


def test_a_variant_that_does_not_build_is_reported_and_the_others_are_timed(fake_gpu, capsys):
    """A build failure had come up as the launch's error, ending the ablation of every layer
    after it; now its line says so, the rest are timed, and the exit status is 1."""
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "152c_14x14_3x3", "--n", "2", "--passes", "fprop",
         "--heuristic", "--variants", "full", "no-mma", "no-loads"]
    )  # fmt: skip
    statuses = [ablate.ablate_layer(args, parse_layer(name)) for name in args.layer]
    assert statuses == [1, 1]
    out = capsys.readouterr().out
    assert out.count("no-mma         did not build: did not build") == 2
    timed = [e for e in fake_gpu if isinstance(e, str)]
    assert len(timed) == 4 and not any("__variant_mma" in name for name in timed)


@pytest.mark.parametrize("option", ["--n", "--repeats"])
def test_a_batch_or_repeat_count_below_1_is_a_usage_error(option, capsys):
    """--n 0 was a traceback from the layer; --repeats 0 one from the copy's timing, after
    every kernel had been compiled and timed."""
    with pytest.raises(SystemExit) as info:
        ablate.parse_args(["--layer", "64c_64x64_3x3", option, "0"])
    assert info.value.code == 2
    assert f"argument {option}: needs a positive integer, got '0'" in capsys.readouterr().err


def test_two_switch_sets_of_one_variant_name_are_refused(base_kernels):
    """Variant names drop SPIO_ABLATE_/SPIO_ and join the switches with "_": two sets could
    share a name, and kernels are kept in memory by name (the second would run the first's
    module). with_defines refuses the second, naming both; the same set again is fine."""
    kernel = base_kernels["fprop"]
    first = kernel.with_defines(("SPIO_ABLATE_LOADS",))
    assert kernel.with_defines(("SPIO_ABLATE_LOADS",)) == first
    with pytest.raises(ValueError, match=r"would name two builds: .*SPIO_ABLATE_LOADS.*SPIO_LOADS"):
        kernel.with_defines(("SPIO_LOADS",))


@pytest.mark.parametrize("variant", ["no-stores", "loads-only"])
def test_wgrad_ablations_leave_out_the_bias_gradient_too(variant):
    """`no-stores` wrote WGrad's dbias all the same, and `no-mma` kept its bias-gradient mma, so a
    layer with a bias timed work the variant names as gone; `no-stores` did not build in the
    emulator (no __float_as_uint). Emulated, with atomics into zeroed buffers: nothing is added
    to dw or dbias."""

    from spio.check import random_inputs
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    params = Conv2dGw8Params(n=2, c=16, h=9, w=12, padding=1, has_bias=True)
    atomic = wg.make_kernel(params, wg.default_config(params), partials=False)
    t = random_inputs(params, seed=4)
    dw, db = wg.wgrad(t["x"], t["dy"], params, kernel=atomic)
    assert dw.abs().sum() > 0 and db.abs().sum() > 0
    dw, db = wg.wgrad(t["x"], t["dy"], params, kernel=atomic.with_defines(ablate.VARIANTS[variant]))
    assert not dw.any() and not db.any(), (dw.abs().sum(), db)


@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
def test_wgrad_no_mma_has_no_mma_with_a_bias():
    """`no-mma` left WGrad's bias-gradient mma in (an HMMA per step in the SASS)."""
    from spio.compiler import sass
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    params = Conv2dGw8Params(n=8, c=64, h=32, w=32, padding=1, has_bias=True)
    kernel = wg.production_kernel(params, wg.default_config(params))
    listing = sass.disassemble(kernel.compile("sm_90").cubin, sass.find_nvdisasm())
    assert "HMMA" in listing
    ablated = kernel.with_defines(ablate.VARIANTS["no-mma"])
    listing = sass.disassemble(ablated.compile("sm_90").cubin, sass.find_nvdisasm())
    assert "HMMA" not in listing


def test_the_swizzled_variants_are_built_and_timed_per_pass(fake_gpu):
    """The GPU check's swizzled lines through ablate_layer: each pass's swizzled kernel (its
    own build, `__swz` in the name) after its full one, FProp/DGrad's pipeline alone swizzled
    too, WGrad's skipped where it has none."""
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "128", "--heuristic",
         "--variants", "full", "swizzled", "pipeline-only", "swizzled-pipeline-only"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 0
    timed = fake_gpu[1:]
    assert len(timed) == 4 + 4 + 2  # FProp and DGrad 4 each, WGrad 2
    # Compiled first, with the one sum that the layer's partials WGrad kernels run.
    assert fake_gpu[0] == len(timed) + any("__partials" in name for name in timed)
    for first in (0, 4):  # FProp's, then DGrad's: full, swizzled, and the pipelines alone
        full, swizzled, pipeline, swizzled_pipeline = timed[first : first + 4]
        assert swizzled == f"{full}__swz" and pipeline.startswith(f"{full}__variant_")
        assert swizzled_pipeline == pipeline.replace(full, swizzled)
    assert timed[9] == f"{timed[8]}__swz" and "conv2d_gw8_wgrad" in timed[8]


def test_a_variant_that_fails_to_run_is_reported_and_the_rest_are_timed(
    fake_gpu, monkeypatch, capsys
):
    """A variant whose launch fails (e.g. a tensor map the driver refuses) is reported on its
    line with the error, the variants after it are still timed, and the exit status is 1."""
    from spio.kernels import autotune

    def time_kernel(family, params, kernel, *args, **kwargs):
        if kernel.info_value("tma"):
            raise RuntimeError("cuTensorMapEncodeTiled failed: CUDA_ERROR_INVALID_VALUE")
        fake_gpu.append(kernel.name)
        return 1e-5

    monkeypatch.setattr(autotune, "time_kernel", time_kernel)
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "2", "--passes", "fprop", "dgrad", "--heuristic",
         "--variants", "full", "tma", "no-loads"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 1
    out = capsys.readouterr().out
    assert out.count("failed: RuntimeError: cuTensorMapEncodeTiled failed") == 2, out
    assert sum(name.endswith("__variant_loads") for name in fake_gpu[1:]) == 2  # both passes


def test_tensor_copy_variants_are_skipped_below_sm_90(fake_gpu, monkeypatch, capsys):
    """On a GPU before sm_90 the tma variants are left out with a line saying why; the others
    are timed and the status stays 0."""
    import types

    import spio.cuda

    ampere = types.SimpleNamespace(
        device_attributes=lambda i: {"name": "GPU", "arch": "sm_80", "l2_cache_bytes": 0}
    )
    monkeypatch.setattr(spio.cuda, "driver", ampere, raising=False)
    monkeypatch.setitem(sys.modules, "spio.cuda.driver", ampere)
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "2", "--passes", "fprop", "--heuristic",
         "--variants", "full", "tma", "tma-pipeline-only", "no-loads"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 0
    assert "tma, tma-pipeline-only: tensor copies need sm_90 or newer" in capsys.readouterr().out
    timed = fake_gpu[1:]
    assert len(timed) == 2 and not any("__tma" in name for name in timed)


def test_variants_that_keep_the_results_are_checked_against_full(fake_gpu, monkeypatch, capsys):
    """Each variant documented to compute the real results (swizzled, tma, ...) is run once on
    the first input set and compared with full's output: a mismatch is a WRONG line and exit
    status 1; ablations (which compute garbage) are not compared."""
    import torch

    from spio.kernels import autotune

    monkeypatch.setattr(autotune, "kernel_inputs", lambda *a: ["inputs"])
    ran = []

    def result_of(family_name, params, kernel, args, device):
        ran.append(kernel.name)
        wrong = kernel.info_value("tma") or "__variant_loads" in kernel.name
        return torch.full((4,), 2.0 if wrong else 1.0)

    monkeypatch.setattr(ablate, "result_of", result_of)
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "2", "--passes", "fprop", "--heuristic",
         "--variants", "full", "no-loads", "swizzled", "tma"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 1
    out = capsys.readouterr().out
    assert "fprop  tma            WRONG results: max |difference| 1, max |full| 1" in out, out
    assert out.count("WRONG") == 1  # swizzled matches; no-loads is an ablation, not compared
    assert len(ran) == 3 and not any("__variant_loads" in name for name in ran)


def test_difference_is_exact_but_for_wgrads_sum_order():
    import torch

    a = torch.tensor([1.0, -2.0, 4.0])
    assert ablate.difference(a, a.clone(), exact=True) is None
    near = a + torch.tensor([0.0, 0.0, 1e-3])
    assert ablate.difference(a, near, exact=True).startswith("max |difference| 0.001")
    assert ablate.difference(a, near, exact=False) is None
    assert ablate.difference(a, a + 0.1, exact=False) == "max |difference| 0.1, max |full| 4"
    nan = torch.tensor([1.0, float("nan"), 4.0])
    assert ablate.difference(a, nan, exact=False).endswith(", NaN")


@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_result_of_emulated_kernels_tells_right_variants_from_ablations(pass_):
    """result_of and difference on real kernels (emulated): the swizzled and tensor-copy
    variants give full's output (bit for bit in FProp/DGrad), an ablation without its loads
    does not: it reads shared memory nothing wrote, which the checked emulator refuses (a GPU
    computes on whatever is there, another output, which difference tells)."""
    import torch

    from spio.emulator import EmulatorError
    from spio.kernels import autotune
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
    from spio.kernels.families import FAMILY_OF_PASS

    family = FAMILY_OF_PASS[pass_]
    params = Conv2dGw8Params(n=2, c=16, h=6, w=10, padding=1, has_bias=pass_ == "wgrad")
    base = family.make_kernel(params, family.default_config(params))
    args = autotune.kernel_inputs(family.name, params, torch.device("cpu"), 0)
    cpu = torch.device("cpu")
    reference = ablate.result_of(family.name, params, base, args, cpu)
    assert torch.isfinite(reference).all() and reference.abs().max() > 0
    for name in ("swizzled", "tma"):
        result = ablate.result_of(family.name, params, ablate.build_variant(base, name), args, cpu)
        assert ablate.difference(reference, result, exact=pass_ != "wgrad") is None, name
    broken = ablate.build_variant(base, "no-loads")
    with pytest.raises(EmulatorError, match="which no thread of this block has written"):
        ablate.result_of(family.name, params, broken, args, cpu)
    # A variant that writes no output differs from full: out is NaN before each call (it had
    # held full's output, so a variant writing nothing passed as right).
    silent = ("SPIO_ABLATE_STORES",) if pass_ == "wgrad" else ablate.VARIANTS["pipeline-only"]
    result = ablate.result_of(family.name, params, base.with_defines(silent), args, cpu)
    assert ablate.difference(reference, result, exact=pass_ != "wgrad") is not None
    assert torch.isnan(result).all()


def test_a_variant_whose_check_fails_to_run_is_reported(fake_gpu, monkeypatch, capsys):
    """A result check that raises (e.g. a launch error after the timing) is reported on its
    line; the next variants are still timed and checked."""
    import torch

    from spio.kernels import autotune

    monkeypatch.setattr(autotune, "kernel_inputs", lambda *a: ["inputs"])

    def result_of(family_name, params, kernel, args, device):
        if kernel.info_value("tma"):
            raise RuntimeError("CUDA_ERROR_ILLEGAL_INSTRUCTION")
        return torch.ones(2)

    monkeypatch.setattr(ablate, "result_of", result_of)
    args = ablate.parse_args(
        ["--layer", "64c_64x64_3x3", "--n", "2", "--passes", "fprop", "--heuristic",
         "--variants", "full", "tma", "swizzled"]
    )  # fmt: skip
    assert ablate.ablate_layer(args, parse_layer("64c_64x64_3x3")) == 1
    out = capsys.readouterr().out
    assert "tma            results not checked: CUDA_ERROR_ILLEGAL_INSTRUCTION" in out, out
    assert "WRONG" not in out and len(fake_gpu[1:]) == 3
