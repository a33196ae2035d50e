"""spio.compiler.sass: finding the main loop in nvdisasm output, and, where nvdisasm is installed
(the test extra installs it), the WGrad kernel's loop in a real cubin."""

import os
import shutil
import subprocess
import sys

import pytest

from spio.compiler import sass
from tests.conftest import REPO

# nvdisasm's layout: labels at column 0, instructions as /*offset*/ text ; with a trailing
# encoding comment. An inner loop without a barrier (.L_x_2) inside the main loop (.L_x_1).
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
    loop = sass.main_loop(_SASS)
    assert loop.instructions == 9  # 0x10 .. 0x90
    assert loop.barriers == 2
    assert loop.per_step == 4.5
    assert (loop.counts["HMMA"], loop.counts["LDSM"], loop.counts["LDGSTS"]) == (2, 1, 1)
    assert loop.per_step_of("HMMA") == 1.0


def test_no_loop_without_a_barrier():
    assert sass.main_loop(_SASS.replace("BAR.SYNC", "NOP")) is None


def test_the_longer_of_two_loops_with_barriers_wins():
    """A prologue loop with a barrier (3 instructions) before the main loop (the fixture's, 9):
    the main loop is the longer one, wherever it lies."""
    prologue = """\
.L_x_0:
        /*0000*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0000*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0000*/               @P4 BRA `(.L_x_0) ;
"""
    loop = sass.main_loop(prologue + _SASS)
    assert (loop.instructions, loop.barriers) == (9, 2)
    epilogue = _SASS.replace(".L_x_3:\n", prologue.replace("L_x_0", "L_x_4") + ".L_x_3:\n")
    loop = sass.main_loop(epilogue)
    assert (loop.instructions, loop.barriers) == (9, 2)


def test_a_branch_to_a_label_outside_the_listing_is_not_a_loop():
    """A branch whose target has no label in the listing is skipped, not a KeyError."""
    loop = sass.main_loop(_SASS.replace(".L_x_3:\n", ""))
    assert (loop.instructions, loop.barriers) == (9, 2)


def test_opcode_drops_predicate_and_modifiers():
    assert sass.opcode("@!P1 HMMA.1688.F32 R24, R28, R57, R24") == "HMMA"
    assert sass.opcode("@!PT LDS RZ, [RZ]") == "LDS"
    assert sass.opcode("BAR.SYNC.DEFER_BLOCKING 0x0") == "BAR"
    # Uniform predicates (UP0..UP6, UPT) are dropped too.
    assert sass.opcode("@!UP0 UIADD3 UR4, UR4, 0x1, URZ") == "UIADD3"
    assert sass.opcode("@UPT BRA `(.L_x_1)") == "BRA"


def test_nvdisasm_named_by_the_environment(monkeypatch, tmp_path):
    """SPIO_NVDISASM wins over an nvdisasm on PATH; one that names no program is an error
    (scripts/sass_loop.py and resource_report.py had ended in a FileNotFoundError traceback,
    the latter after minutes of compiles)."""
    on_path = tmp_path / "nvdisasm"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    elsewhere = tmp_path / "somewhere" / "nvdisasm"
    elsewhere.parent.mkdir()
    shutil.copy(on_path, elsewhere)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SPIO_NVDISASM", str(elsewhere))
    assert sass.find_nvdisasm() == str(elsewhere)
    monkeypatch.setenv("SPIO_NVDISASM", "nvdisasm")  # a bare name: found on PATH
    assert sass.find_nvdisasm() == "nvdisasm"
    monkeypatch.setenv("SPIO_NVDISASM", "/nonexistent/nvdisasm")
    with pytest.raises(ValueError, match="^SPIO_NVDISASM must name nvdisasm, got '/nonexist"):
        sass.find_nvdisasm()
    monkeypatch.delenv("SPIO_NVDISASM")
    assert sass.find_nvdisasm() == str(on_path)


@pytest.mark.parametrize("script", ["sass_loop.py", "resource_report.py"])
def test_scripts_name_a_bad_nvdisasm_setting_before_compiling(script):
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script)],
        capture_output=True,
        text=True,
        env=dict(os.environ, SPIO_NVDISASM="/nonexistent/nvdisasm"),
        timeout=120,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "SPIO_NVDISASM must name nvdisasm, got '/nonexistent/nvdisasm'" in out.stderr


def test_a_failing_nvdisasm_says_why(tmp_path):
    """nvdisasm's own message had been lost (a CalledProcessError saying only its exit status)."""
    tool = tmp_path / "nvdisasm"
    tool.write_text(
        "#!/bin/sh\necho 'nvdisasm fatal   : Object file appears truncated' >&2\nexit 1\n"
    )
    tool.chmod(0o755)
    with pytest.raises(RuntimeError, match="failed \\(exit 1\\): nvdisasm fatal   : Object file"):
        sass.disassemble(b"not a cubin", str(tool))


def test_nvdisasm_from_the_wheel_on_sys_path(monkeypatch, tmp_path):
    """Without SPIO_NVDISASM or PATH, the wheel's nvidia/cu*/bin/nvdisasm under a sys.path
    entry is found (the test extra installs it there; the real-cubin tests skip without it)."""
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "bin" / "nvdisasm"
    wheel.parent.mkdir(parents=True)
    wheel.write_text("")
    monkeypatch.delenv("SPIO_NVDISASM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr("sys.path", ["", str(tmp_path / "none"), str(tmp_path / "site")])
    assert sass.find_nvdisasm() == str(wheel)
    monkeypatch.setattr("sys.path", [str(tmp_path / "none")])
    assert sass.find_nvdisasm() is None


def test_nvdisasm_of_the_newest_cuda_wheel(monkeypatch, tmp_path):
    """With the CUDA 12 and 13 wheels side by side, CUDA 13's nvdisasm (it reads CUDA 12's
    cubins; CUDA 12's may not read 13's); names sorted as text had put cu12 first."""
    site = tmp_path / "site" / "nvidia"
    for folder in ("cu12", "cu13", "cuda_nvdisasm", "cu9"):
        (site / folder / "bin").mkdir(parents=True)
        (site / folder / "bin" / "nvdisasm").write_text("")
    monkeypatch.delenv("SPIO_NVDISASM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr("sys.path", [str(tmp_path / "site")])
    assert sass.find_nvdisasm() == str(site / "cu13" / "bin" / "nvdisasm")


@pytest.mark.skipif(sass.find_nvdisasm() is None, reason="nvdisasm not installed")
def test_wgrad_main_loop_from_a_real_cubin():
    """A full WGrad step issues its tap pairs' mma and ldmatrix once: 2 pairs x 3 taps x 4 runs
    = 24 m16n8k8, and 4 runs x (3 + 2) ldmatrix, around one barrier. It is counted on the build
    without the careful copy of the step (Family.full_step_defines), which the kernel as run
    also has in its loop, for the steps at a tile's edges."""
    from spio.kernels import Conv2dGw8Params
    from spio.kernels.families import FAMILY_OF_PASS

    family = FAMILY_OF_PASS["wgrad"]
    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1, r=3, s=3)
    kernel = family.make_kernel(params, family.config_named(params, "g2_p32_q64_n4_w4_s6_k8"))
    full_step = kernel.with_defines(family.full_step_defines)
    loop = sass.loop_report(full_step.compile("sm_90").cubin, sass.find_nvdisasm())
    assert loop.barriers == 1
    assert (loop.counts["HMMA"], loop.counts["LDSM"]) == (24, 20)
    # The step's index arithmetic is worked out once per step, not once per 8-pixel run: 311
    # instructions a step before that change, 162 after (NVRTC 12.9), 150 with no pair skipped,
    # 123 with predicated copies and no branch around the last steps' copies (below).
    assert loop.instructions < 200
    as_run = sass.loop_report(kernel.compile("sm_90").cubin, sass.find_nvdisasm())
    assert as_run.barriers == 1 and as_run.counts["HMMA"] > 24  # both copies of the runs


@pytest.mark.skipif(sass.find_nvdisasm() is None, reason="nvdisasm not installed")
def test_wgrad_predicated_copies_keep_address_work_out_of_the_loop():
    """WGrad's row copies are predicated (cp_async_16_if), and the steps past the last copy
    zeros instead of branching around their copies, so the shared-memory side of the copies'
    addresses is worked out once, outside the loop. Under branches (SPIO_COPY_UNDER_BRANCH, the
    code before) ptxas redid it each step, reading the CTA's shared window (S2R) and the kernel's
    pointer arguments (LDC) again: 150 instructions a step against 123 (NVRTC 12.9, sm_90)."""
    from spio.kernels import Conv2dGw8Params
    from spio.kernels.families import FAMILY_OF_PASS

    family = FAMILY_OF_PASS["wgrad"]
    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1, r=3, s=3)
    kernel = family.make_kernel(params, family.config_named(params, "g2_p32_q64_n4_w4_s6_k8"))
    full_step = kernel.with_defines(family.full_step_defines)
    under_branch = full_step.with_defines(("SPIO_COPY_UNDER_BRANCH",))
    nvdisasm = sass.find_nvdisasm()
    loop = sass.loop_report(full_step.compile("sm_90").cubin, nvdisasm)
    loop_branch = sass.loop_report(under_branch.compile("sm_90").cubin, nvdisasm)
    assert loop.counts["LDGSTS"] == loop_branch.counts["LDGSTS"] == 3
    assert loop.counts["HMMA"] == loop_branch.counts["HMMA"] == 24
    assert loop.counts["S2R"] + loop.counts["LDC"] == 0
    assert loop_branch.counts["S2R"] + loop_branch.counts["LDC"] > 0
    assert loop.instructions < 0.9 * loop_branch.instructions


@pytest.mark.skipif(sass.find_nvdisasm() is None, reason="nvdisasm not installed")
def test_fprop_stages_are_constants_in_a_loop_unrolled_to_a_multiple_of_them():
    """The 64c 64x64 layer's 6-stage FProp config unrolls its loop by 6 steps, a multiple of R
    and of the stages, so a step's input stage is a constant: 6 barriers in the loop, each step's
    6 mma and 3 ldmatrix, and under half the instructions of the loop unrolled by R alone
    (SPIO_UNROLL_BY_R), which divides each row for its stage (NVRTC 12.9, sm_90: 40 against 90)."""
    from spio.kernels import Conv2dGw8Params
    from spio.kernels.families import FAMILY_OF_PASS

    family = FAMILY_OF_PASS["fprop"]
    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1, r=3, s=3)
    kernel = family.make_kernel(params, family.config_named(params, "g2_p64_q64_w1_s6_k16"))
    nvdisasm = sass.find_nvdisasm()
    loop = sass.loop_report(kernel.compile("sm_90").cubin, nvdisasm)
    by_r = kernel.with_defines(("SPIO_UNROLL_BY_R",))
    loop_by_r = sass.loop_report(by_r.compile("sm_90").cubin, nvdisasm)
    assert (loop.barriers, loop_by_r.barriers) == (6, 3)
    assert loop.per_step_of("HMMA") == loop_by_r.per_step_of("HMMA") == 6
    assert loop.per_step_of("LDSM") == loop_by_r.per_step_of("LDSM") == 3
    assert loop.per_step < 0.6 * loop_by_r.per_step
