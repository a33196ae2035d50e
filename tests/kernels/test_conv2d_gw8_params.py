"""Conv2dGw8Params: derived shapes, validation, encode/decode, from_tensors."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spio.kernels import Conv2dGw8Params


def test_defaults_and_derived_shapes():
    p = Conv2dGw8Params(n=4, c=64, h=32, w=30)
    assert p.padding == (1, 1) and p.padding_h == 1 and p.padding_w == 1
    assert (p.r, p.s, p.has_bias, p.dtype) == (3, 3, False, "fp16")
    assert (p.p, p.q) == (32, 30)
    assert p.output_shape == (4, 64, 32, 30)
    assert p.weight_shape == (64, 8, 3, 3)
    assert p.groups == 8


def test_asymmetric_padding_and_filter():
    p = Conv2dGw8Params(2, 16, 10, 12, padding=(0, 2), r=1, s=5, has_bias=True, dtype="bf16")
    assert p.padding == (0, 2)
    assert (p.p, p.q) == (10 - 1 + 1, 12 + 4 - 5 + 1)
    assert p.output_shape == (2, 16, 10, 12)


def test_padding_list_is_normalised_to_tuple():
    p = Conv2dGw8Params(1, 8, 5, 5, padding=[2, 1])
    assert p.padding == (2, 1) and isinstance(p.padding, tuple)
    assert p == Conv2dGw8Params(1, 8, 5, 5, padding=(2, 1))
    assert hash(p) == hash(Conv2dGw8Params(1, 8, 5, 5, padding=(2, 1)))


def test_frozen():
    p = Conv2dGw8Params(1, 8, 5, 5)
    with pytest.raises(AttributeError):
        p.n = 2


@pytest.mark.parametrize(
    "dtype, name",
    [
        (torch.float16, "fp16"),
        (torch.bfloat16, "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("torch.bfloat16", "bf16"),
        ("bf16", "bf16"),
    ],
)
def test_dtype_is_stored_as_its_short_name(dtype, name):
    params = Conv2dGw8Params(n=1, c=16, h=3, w=3, dtype=dtype)
    assert params.dtype == name
    assert params == Conv2dGw8Params(n=1, c=16, h=3, w=3, dtype=name)
    assert params.encode().endswith(f"_{name}")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(c=12), "multiple of 8, got 12"),
        (dict(c=0), "multiple of 8, got 0"),
        (dict(c=-8), "multiple of 8, got -8"),
        (dict(r=0), "R in 1..5, got 0"),
        (dict(r=6), "R in 1..5, got 6"),
        (dict(s=7), "S in 1..5, got 7"),
        (dict(padding=-1), "non-negative padding, got (-1, -1)"),
        (dict(padding=(1, -2)), "non-negative padding, got (1, -2)"),
        (dict(padding=(1, 1, 1)), "padding as an int or a pair"),
        (dict(padding=(1,)), "padding as an int or a pair, got (1,)"),
        (dict(n=0), "n >= 1, got 0"),
        (dict(h=0), "h >= 1, got 0"),
        (dict(w=-3), "w >= 1, got -3"),
        (dict(dtype="fp32"), "dtype fp16 or bf16 (or torch.float16, torch.bfloat16), got 'fp32'"),
        (dict(dtype=torch.float32), "got torch.float32"),
        (dict(h=2, padding=0), "non-empty output, got output size 0x1"),
        (dict(w=1, s=5, padding=(1, 1)), "non-empty output, got output size 3x-1"),
        (dict(has_bias=2), "has_bias True or False, got 2"),
    ],
)
def test_invalid(kwargs, message):
    args = dict(n=1, c=16, h=3, w=3, padding=1) | kwargs
    with pytest.raises(ValueError) as info:
        Conv2dGw8Params(**args)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=2.0), "integer n, got 2.0"),
        (dict(n=-0.0), "integer n, got -0.0"),
        (dict(r=True), "integer r, got True"),
        (dict(h="3"), "integer h, got '3'"),
        (dict(w=None), "integer w, got None"),
        (dict(padding=1.0), "integer padding, got 1.0"),
        (dict(padding=(1, 1.0)), "integer padding, got 1.0"),
        (dict(padding="same"), "integer padding, got 'same'"),
        (dict(has_bias="no"), "has_bias True or False, got 'no'"),
        (dict(has_bias=None), "has_bias True or False, got None"),
        (dict(has_bias=1.0), "has_bias True or False, got 1.0"),
        (dict(dtype=None), "dtype fp16 or bf16 (or torch.float16, torch.bfloat16), got None"),
        (dict(dtype=16), "got 16"),
    ],
)
def test_arguments_of_the_wrong_type_are_a_type_error(kwargs, message):
    """A float (even a whole one), a bool, a string or None where an int belongs is the wrong
    type, a TypeError as in Python, PyTorch, Conv2dGw8 and spio.functional.conv2d_gw8; it was a
    ValueError here alone."""
    args = dict(n=1, c=16, h=3, w=3, padding=1) | kwargs
    with pytest.raises(TypeError) as info:
        Conv2dGw8Params(**args)
    assert message in str(info.value)


def test_integers_of_other_types_are_taken_as_ints():
    """numpy integers and 0-d integer tensors (what a shape or a size often is) are ints."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    p = Conv2dGw8Params(np.int64(2), torch.tensor(16), 5, 5, padding=(np.int32(1), 0), r=3)
    assert p == Conv2dGw8Params(2, 16, 5, 5, padding=(1, 0))
    assert type(p.n) is int and type(p.c) is int and type(p.padding_h) is int


def test_bool_and_one_element_tensors_are_not_ints():
    """A bool tensor's __index__ answers 0 or 1 and a one-element tensor's its element: they had
    passed as ints (a layer of torch.tensor(True) images), where a bool or a list is refused."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    for bad in (torch.tensor(True), torch.tensor([3]), np.array([3]), np.True_):
        with pytest.raises(TypeError, match="integer n"):
            Conv2dGw8Params(n=bad, c=16, h=3, w=3)
        with pytest.raises(TypeError, match="padding"):
            Conv2dGw8Params(n=1, c=16, h=3, w=3, padding=(bad, 1))
    assert Conv2dGw8Params(n=np.array(2), c=16, h=3, w=3).n == 2  # a 0-d integer array is one


def layers(max_padding: int, dtypes: tuple[str, ...] = ("fp16",)) -> st.SearchStrategy:
    """Random layers: N up to 512, C up to 1024, 5 to 300 pixels a side, R and S 1..5, padding
    up to `max_padding` each way, with or without a bias, of `dtypes`."""

    def layer(n, c8, h, w, ph, pw, r, s, has_bias, dtype):
        return Conv2dGw8Params(n, 8 * c8, h, w, (ph, pw), r, s, has_bias, dtype)

    pad = st.integers(0, max_padding)
    filter_size = st.integers(1, 5)
    return st.builds(
        layer,
        st.integers(1, 512),
        st.integers(1, 128),
        st.integers(5, 300),
        st.integers(5, 300),
        pad,
        pad,
        filter_size,
        filter_size,
        st.booleans(),
        st.sampled_from(dtypes),
    )


@given(p=layers(max_padding=4, dtypes=("fp16", "bf16")))
def test_encode_decode_round_trip(p):
    text = p.encode()
    assert " " not in text and "/" not in text
    assert Conv2dGw8Params.decode(text) == p


def test_encode_image_leaves_out_the_batch_size_alone():
    """What a kernel is built for: the layer without its batch size (a launch argument)."""
    a = Conv2dGw8Params(12, 16, 8, 9, padding=(1, 2), r=3, s=5, has_bias=True, dtype="bf16")
    assert a.encode_image() == "c16_h8_w9_pad1x2_r3_s5_bias1_bf16"
    assert a.encode() == "n12_" + a.encode_image()
    assert Conv2dGw8Params(1, 16, 8, 9, padding=(1, 2), r=3, s=5, has_bias=True,
                           dtype="bf16").encode_image() == a.encode_image()  # fmt: skip
    assert Conv2dGw8Params(12, 16, 8, 9, padding=(2, 1)).encode_image() != a.encode_image()


def test_encode_is_distinct():
    a = Conv2dGw8Params(2, 16, 8, 9, padding=(1, 2))
    b = Conv2dGw8Params(2, 16, 8, 9, padding=(2, 1))
    assert a.encode() != b.encode()
    assert a.encode() != Conv2dGw8Params(2, 16, 8, 9, padding=(1, 2), dtype="bf16").encode()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "n1_c8",
        "n1_c8_h5_w5_pad1x1_r3_s3_bias2_fp16",
        "junk",
        "n01_c8_h5_w5_pad1x1_r3_s3_bias0_fp16",  # not how encode writes 1
        "n1_c8_h5_w5_pad1x1_r\uff13_s3_bias0_fp16",  # a full-width digit 3
    ],
)
def test_decode_rejects_garbage(text):
    with pytest.raises(ValueError, match="not an encoded"):
        Conv2dGw8Params.decode(text)


def test_decode_still_validates():
    with pytest.raises(ValueError, match="multiple of 8"):
        Conv2dGw8Params.decode("n1_c12_h5_w5_pad1x1_r3_s3_bias0_fp16")


def test_import_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, spio.kernels; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


class TestFromTensors:
    torch = pytest.importorskip("torch")

    def test_shapes(self):
        torch = self.torch
        x = torch.randn(3, 24, 7, 9, dtype=torch.bfloat16)
        w = torch.randn(24, 8, 3, 5, dtype=torch.bfloat16)
        p = Conv2dGw8Params.from_tensors(x, w, torch.randn(24), padding=(1, 2))
        assert p == Conv2dGw8Params(3, 24, 7, 9, (1, 2), 3, 5, True, "bf16")

    def test_padding_defaults_as_in_the_constructor(self):
        """Without padding, from_tensors gives the layer Conv2dGw8Params gives without it, (1, 1)
        (the 3x3 layers' "same"), not the op's default of 0."""
        torch = self.torch
        x = torch.randn(2, 16, 5, 6, dtype=torch.float16)
        w = torch.randn(16, 8, 3, 3, dtype=torch.float16)
        p = Conv2dGw8Params.from_tensors(x, w)
        assert p == Conv2dGw8Params(2, 16, 5, 6) and p.padding == (1, 1)

    @pytest.mark.parametrize(
        "x_shape, w_shape, b_shape, dtype, message",
        [
            ((2, 16, 5, 5), (16, 4, 3, 3), None, "float16", "group width 8, got 4"),
            ((2, 16, 5, 5), (32, 8, 3, 3), None, "float16", "C=16, K=32"),
            ((16, 5, 5), (16, 8, 3, 3), None, "float16", "4-D input, got 3-D"),
            ((2, 16, 5, 5), (16, 8, 3), None, "float16", "4-D weight, got 3-D"),
            ((2, 16, 5, 5), (16, 8, 3, 3), (8,), "float16", "bias of shape (16,), got (8,)"),
            ((2, 16, 5, 5), (16, 8, 3, 3), (1, 16), "float16", "bias of shape (16,), got (1, 16)"),
            ((2, 16, 5, 5), (16, 8, 3, 3), None, "float32", "fp16 or bf16, got torch.float32"),
            ((2, 16, 5, 5), (16, 8, 7, 3), None, "float16", "R in 1..5, got 7"),
        ],
    )
    def test_invalid(self, x_shape, w_shape, b_shape, dtype, message):
        torch = self.torch
        dt = getattr(torch, dtype)
        x = torch.randn(x_shape, dtype=dt)
        w = torch.randn(w_shape, dtype=dt)
        b = None if b_shape is None else torch.randn(b_shape)
        with pytest.raises(ValueError) as info:
            Conv2dGw8Params.from_tensors(x, w, b)
        assert message in str(info.value)

    def test_an_operand_that_is_no_tensor_is_a_type_error_naming_it(self):
        """It was an AttributeError ("'NoneType' object has no attribute 'dim'")."""
        torch = self.torch
        x = torch.randn(1, 8, 4, 4, dtype=torch.float16)
        w = torch.randn(8, 8, 3, 3, dtype=torch.float16)
        for args, message in (
            ((None, w), "input to be a tensor, got NoneType"),
            ((x, [1.0]), "weight to be a tensor, got list"),
            ((x, w, [0.0] * 8), "bias to be a tensor or None, got list"),
        ):
            with pytest.raises(TypeError, match=f"^Conv2dGw8Params.from_tensors needs {message}$"):
                Conv2dGw8Params.from_tensors(*args)

    def test_mixed_dtypes(self):
        torch = self.torch
        x = torch.randn(1, 8, 4, 4, dtype=torch.float16)
        w = torch.randn(8, 8, 3, 3, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="weight dtype equal to input dtype"):
            Conv2dGw8Params.from_tensors(x, w)


def test_the_kernel_apis_name_an_argument_of_the_wrong_kind():
    """Each had failed with an AttributeError or int()'s message naming nothing, or taken the
    value: a tuple or an encoded name for params, None for decode, igrad "no" (DGrad's configs)
    or 2 (a header defining SPIO_CONV_IGRAD 2), an option WGrad does not take, a float device."""
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import conv2d_gw8_kernel_factory as F
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels import conv2d_gw8_wgrad_kernel_factory as W
    from spio.kernels.stats import Conv2dStats

    p = Conv2dGw8Params(1, 8, 4, 4)
    get = "conv2d_gw8_kernel_factory.get_kernel"
    calls = {
        "conv2d_gw8 configs needs a Conv2dGw8Params, got (1, 8, 4, 4)": lambda: F.configs(
            (1, 8, 4, 4)
        ),
        "conv2d_gw8_wgrad configs needs a Conv2dGw8Params, got (1, 8, 4, 4)": lambda: wg.configs(
            (1, 8, 4, 4)
        ),
        f"{get} needs a Conv2dGw8Params, got 'n1_c8_h4_w4_pad1x1_r3_s3_bias0_fp16' "
        "(Conv2dGw8Params.decode reads an encoded name)": lambda: F.get_kernel(p.encode(), "cpu"),
        "Conv2dStats needs a Conv2dGw8Params, got (1, 8, 4, 4)": lambda: Conv2dStats((1, 8, 4, 4)),
        "Conv2dGw8Params.decode needs a str, got None": lambda: Conv2dGw8Params.decode(None),
        "conv2d_gw8 configs needs igrad True or False, got 'no'": lambda: F.configs(p, igrad="no"),
        f"{get} needs igrad True or False, got 2": lambda: F.get_kernel(p, "cpu", igrad=2),
        f"{get} needs igrad True or False, got None": lambda: F.get_kernel(p, "cpu", igrad=None),
        "conv2d_gw8 make_kernel needs igrad True or False, got 2": lambda: fd.make_kernel(
            p, igrad=2
        ),
        "conv2d_gw8_wgrad_kernel_factory.get_kernel takes no option 'igrad' (its options: none)": (
            lambda: W.get_kernel(p, "cpu", igrad=True)
        ),
        f"{get} needs a device: a torch.device, a string or a GPU ordinal, got 1.5": lambda: (
            F.get_kernel(p, 1.5)
        ),
    }
    for said, call in calls.items():
        with pytest.raises(TypeError) as error:
            call()
        assert str(error.value) == said
    assert F.get_kernel(p, "cpu", igrad=True).name.startswith("conv2d_gw8_dgrad")
    # numpy's bools count, as make_kernel's flags do (and are held as plain bools)
    dgrad = F.get_kernel(p, "cpu", igrad=np.bool_(True))
    assert dgrad.name.startswith("conv2d_gw8_dgrad") and type(dgrad.info_value("igrad")) is bool
    assert F.configs(p, igrad=np.True_) == F.configs(p, igrad=True)


def test_has_bias_takes_numpys_and_torchs_bools_and_a_bias_must_be_floating_point():
    """np.True_ was refused as "needs has_bias True or False, got np.True_" (while numpy's ints
    are taken for n, c, h, w); an int or complex bias passed from_tensors, then cast."""
    import numpy as np

    for true in (True, 1, np.True_, torch.tensor(True)):
        assert Conv2dGw8Params(1, 8, 4, 4, has_bias=true).has_bias is True
    for bad, error in ((2, ValueError), ("yes", TypeError), (torch.tensor([True]), TypeError)):
        with pytest.raises(error, match="needs has_bias True or False"):
            Conv2dGw8Params(1, 8, 4, 4, has_bias=bad)
    x, w = torch.zeros(1, 8, 4, 4, dtype=torch.half), torch.zeros(8, 8, 3, 3, dtype=torch.half)
    for dtype in (torch.int64, torch.bool, torch.complex64):
        with pytest.raises(ValueError, match=f"needs a floating-point bias, got {dtype}"):
            Conv2dGw8Params.from_tensors(x, w, torch.zeros(8, dtype=dtype))
    assert Conv2dGw8Params.from_tensors(x, w, torch.zeros(8)).has_bias


def test_has_bias_takes_integers_of_other_types_as_every_int_field_does():
    """numpy's 1 and a 0-d tensor's 0 were refused for has_bias (a ValueError), where the int 1
    and every other field's numpy integers were taken."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert Conv2dGw8Params(1, 16, 3, 3, has_bias=np.int64(1)).has_bias is True
    assert Conv2dGw8Params(1, 16, 3, 3, has_bias=torch.tensor(0)).has_bias is False
    with pytest.raises(ValueError, match="has_bias True or False, got np.int64"):
        Conv2dGw8Params(1, 16, 3, 3, has_bias=np.int64(2))


def test_the_launch_functions_name_an_argument_of_the_wrong_kind():
    """The low-level fprop, dgrad and wgrad, and make_kernel given a config, had not checked
    their params, tensors, out or kernel: each ended in an AttributeError naming an attribute
    (a tuple's 'dtype', an int's 'shape', a string's 'source_file'); make_kernel given a name
    blamed "configs"; make_kernel's variant flags took any value ("no" built the __wcl kernel)."""
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    p = Conv2dGw8Params(1, 16, 6, 6)
    x = torch.randn(p.input_shape, dtype=torch.float16)
    dy = torch.randn(p.output_shape, dtype=torch.float16)
    w = torch.randn(p.weight_shape, dtype=torch.float16)
    calls = {
        "conv2d_gw8 fprop needs a Conv2dGw8Params, got None": lambda: fd.fprop(x, w, None, None),
        "conv2d_gw8 dgrad needs a Conv2dGw8Params, got (1, 16, 6, 6)": lambda: fd.dgrad(
            dy, w, (1, 16, 6, 6)
        ),
        "conv2d_gw8 wgrad needs a Conv2dGw8Params, got None": lambda: wg.wgrad(x, dy, None),
        "conv2d_gw8 fprop needs x to be a tensor, got NoneType": lambda: fd.fprop(None, w, None, p),
        "conv2d_gw8 fprop needs bias to be a tensor or None, got int": lambda: fd.fprop(x, w, 1, p),
        "conv2d_gw8 dgrad needs weight to be a tensor, got list": lambda: fd.dgrad(dy, [1], p),
        "conv2d_gw8 wgrad needs dy to be a tensor, got str": lambda: wg.wgrad(x, "dy", p),
        "conv2d_gw8 fprop needs kernel to be a Kernel or None, got str": lambda: fd.fprop(
            x, w, None, p, kernel="k"
        ),
        "conv2d_gw8 out must be a tensor or None, got int": lambda: fd.fprop(x, w, None, p, out=5),
        "conv2d_gw8 make_kernel needs a Conv2dGw8Params, got None": lambda: fd.make_kernel(
            None, fd.Conv2dGw8Config()
        ),
        "conv2d_gw8 make_kernel needs a Conv2dGw8Params, got 'n1' "
        "(Conv2dGw8Params.decode reads an encoded name)": lambda: fd.make_kernel("n1"),
        "conv2d_gw8_wgrad make_kernel needs a Conv2dGw8Params, got None": lambda: wg.make_kernel(
            None, wg.Conv2dGw8WgradConfig()
        ),
        "conv2d_gw8 make_kernel needs weights_cl True or False, got 'no'": lambda: fd.make_kernel(
            p, weights_cl="no"
        ),
        "conv2d_gw8 make_kernel needs tma_stores True or False, got 1": lambda: fd.make_kernel(
            p, tma_stores=1
        ),
        "conv2d_gw8_wgrad make_kernel needs partials True or False, got None": lambda: (
            wg.make_kernel(p, partials=None)
        ),
        "conv2d_gw8 wgrad needs dtypes a (dw, dbias) pair of torch dtypes, got ('fp32', 'fp32')": (
            lambda: wg.wgrad(x, dy, p, dtypes=("fp32", "fp32"))
        ),
    }
    for said, call in calls.items():
        with pytest.raises(TypeError) as error:
            call()
        assert str(error.value) == said
    # numpy's bools and 0-d bool tensors count, as elsewhere in the API, held as plain bools.
    import numpy as np

    wcl = fd.make_kernel(p, weights_cl=np.True_)
    assert wcl.name.endswith("__wcl") and wcl.info_value("weights_cl") is True
    atomic = wg.make_kernel(p, partials=torch.tensor(False))
    assert atomic == wg.make_kernel(p) and atomic.info_value("partials") is False


def test_wgrad_refuses_gradient_dtypes_it_would_truncate_into():
    """dtypes=(torch.int32, ...) gave an int32 dw of truncated sums, silently, on the atomic
    path (the partials path named a float64 one without naming `dtypes`)."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    p = Conv2dGw8Params(1, 16, 6, 6)
    x = torch.randn(p.input_shape, dtype=torch.float16)
    dy = torch.randn(p.output_shape, dtype=torch.float16)
    config = wg.default_config(p)
    for partials in (True, False):
        kernel = wg.make_kernel(p, config, partials=partials)
        for dtypes in ((torch.int32, torch.float32), (torch.float32, torch.float64)):
            with pytest.raises(ValueError) as error:
                wg.wgrad(x, dy, p, kernel=kernel, dtypes=dtypes)
            assert str(error.value) == (
                "conv2d_gw8 wgrad needs dtypes (dw, dbias) among torch.float32, torch.float16 "
                f"and torch.bfloat16, got {dtypes}"
            )


def test_get_kernel_names_a_device_torch_cannot_read():
    """A bad device string or a negative ordinal reached torch.device, whose RuntimeError named
    neither get_kernel nor the argument."""
    from spio.kernels import conv2d_gw8_kernel_factory as F

    p = Conv2dGw8Params(1, 8, 4, 4)
    get = "conv2d_gw8_kernel_factory.get_kernel"
    for device, torchs in (("gpu", "Expected one of"), (-1, "Device index must not be negative")):
        with pytest.raises(ValueError) as error:
            F.get_kernel(p, device)
        assert str(error.value).startswith(f"{get} needs a device, got {device!r}: {torchs}")


def test_stats_times_must_be_numbers():
    """A string or None time ended in Python's "'>' not supported" TypeError."""
    import numpy as np

    from spio.kernels.stats import Conv2dStats

    stats = Conv2dStats(Conv2dGw8Params(1, 8, 4, 4))
    for where, call in (
        ("effective_bandwidth", stats.effective_bandwidth),
        ("throughput", stats.throughput),
    ):
        for bad in ("1e-3", None, True):
            with pytest.raises(TypeError) as error:
                call(bad, "fprop")
            assert str(error.value) == f"{where} needs seconds as a number, got {bad!r}"
        for bad in (0, -1.0, float("nan")):
            with pytest.raises(ValueError, match=f"^{where} needs a positive time"):
                call(bad, "fprop")
        assert call(np.float32(0.5), "fprop") == call(0.5, "fprop")
