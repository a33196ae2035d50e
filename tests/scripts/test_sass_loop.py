"""scripts/sass_loop.py: finding the main loop in nvdisasm output, and, where nvdisasm is
installed, the WGrad kernel's loop from a real cubin."""

import importlib.util
import pathlib
import shutil
import sys

import pytest

_path = pathlib.Path(__file__).parents[2] / "scripts" / "sass_loop.py"
_spec = importlib.util.spec_from_file_location("sass_loop", _path)
sass_loop = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sass_loop
_spec.loader.exec_module(sass_loop)

# nvdisasm's layout: labels at column 0, instructions as /*offset*/ text ; with a trailing
# encoding comment. An inner loop without a barrier (.L_x_2) and the main loop (.L_x_1).
_SASS = """\
        /*0000*/                   MOV R1, c[0x0][0x28] ;   /* 0x00000a0000017a02 */
.L_x_1:
        /*0010*/                   DEPBAR.LE SB0, 0x4 ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0030*/               @P0 LDGSTS.E.BYPASS.128 [R21], desc[UR6][R26.64], P6 ;
.L_x_2:
        /*0040*/                   LDSM.16.MT88.2 R28, [R28] ;
        /*0050*/                   HMMA.1688.F32 R24, R28.reuse, R57, R24 ;
        /*0060*/              @!P1 BRA `(.L_x_2) ;
        /*0070*/                   HMMA.1688.F32 R20, R28, R56, R20 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/               @P2 BRA `(.L_x_1) ;
        /*00a0*/               @P3 BRA `(.L_x_3) ;
.L_x_3:
        /*00b0*/                   EXIT ;
"""


def test_main_loop_is_the_longest_backward_branch_with_a_barrier():
    loop = sass_loop.main_loop(_SASS)
    assert loop.instructions == 9  # 0x10 .. 0x90
    assert loop.barriers == 2
    assert loop.per_step == 4.5
    assert (loop.counts["HMMA"], loop.counts["LDSM"], loop.counts["LDGSTS"]) == (2, 1, 1)


def test_no_loop_without_a_barrier():
    assert sass_loop.main_loop(_SASS.replace("BAR.SYNC", "NOP")) is None


def test_opcode_drops_predicate_and_modifiers():
    assert sass_loop.opcode("@!P1 HMMA.1688.F32 R24, R28, R57, R24") == "HMMA"
    assert sass_loop.opcode("@!PT LDS RZ, [RZ]") == "LDS"
    assert sass_loop.opcode("BAR.SYNC.DEFER_BLOCKING 0x0") == "BAR"


def _nvdisasm():
    try:
        return sass_loop.find_nvdisasm()
    except SystemExit:
        return None


@pytest.mark.skipif(
    _nvdisasm() is None and shutil.which("nvdisasm") is None, reason="nvdisasm not installed"
)
def test_wgrad_main_loop_from_a_real_cubin():
    """The WGrad loop issues its tap pairs' mma and ldmatrix once per step: 2 pairs x 3 taps x
    4 runs = 24 m16n8k8, and 4 runs x (3 + 2) ldmatrix, around one barrier."""
    from spio.kernels import Conv2dGw8Params
    from spio.kernels import conv2d_gw8_wgrad_factory as wf

    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1, r=3, s=3)
    config = next(c for c in wf.configs(params) if c.encode() == "g2_p32_q64_n4_w4_s6_k8")
    cubin = wf.production_kernel(params, config).compile("sm_90").cubin
    loop = sass_loop.main_loop(sass_loop.disassemble(cubin, _nvdisasm()))
    assert loop.barriers == 1
    assert (loop.counts["HMMA"], loop.counts["LDSM"]) == (24, 20)
    # The row's index arithmetic is worked out once per step, not once per run: 311 instructions
    # a step before that change, 163 after (NVRTC 13.0).
    assert loop.instructions < 200
