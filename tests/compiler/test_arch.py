"""spio.compiler.arch: which GPU architectures spio builds for, and what it says about the rest."""

import pytest

from spio.compiler import arch


@pytest.mark.parametrize(
    "name,builds",
    [
        ("sm_80", True),
        ("sm_86", True),
        ("sm_89", True),
        ("sm_90", True),
        # Experimental: built, not tested.
        ("sm_100", True),
        ("sm_120", True),
        ("sm_75", False),
        ("sm_91", False),
        ("", False),
    ],
)
def test_builds_for_the_tested_and_the_experimental_archs(name, builds):
    """The info command and the functional fallback ask builds_for whether a GPU runs spio's
    kernels: an experimental arch (sm_100, sm_120) does, an unknown one does not."""
    assert arch.builds_for(name) is builds


def test_arch_of_puts_the_major_version_first():
    """(major, minor) compute capability -> 'sm_<major><minor>', also for a two-digit major."""
    assert arch.arch_of((8, 6)) == "sm_86"
    assert arch.arch_of((9, 0)) == "sm_90"
    assert arch.arch_of((12, 0)) == "sm_120"


def test_an_experimental_arch_warns_once(monkeypatch, caplog):
    """check_arch accepts an experimental arch with one warning per process, not one per
    compile (a sweep compiles hundreds of kernels)."""
    monkeypatch.setattr(arch, "_warned", set())
    with caplog.at_level("WARNING", logger="spio"):
        assert arch.check_arch("sm_120") == "sm_120"
        assert arch.check_arch("sm_120") == "sm_120"
        assert arch.check_arch("sm_90") == "sm_90"
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["sm_120 is experimental: spio's kernels are not tested on it"]


def test_an_unknown_arch_error_names_every_arch_spio_builds_for():
    """The error lists the experimental archs too, since check_arch accepts them."""
    with pytest.raises(ValueError) as info:
        arch.check_arch("sm_75")
    assert str(info.value) == (
        "unknown GPU architecture 'sm_75'; spio compiles for "
        "sm_80, sm_86, sm_89, sm_90, sm_100, sm_120"
    )


def test_bulk_copies_from_sm_90_on():
    """Bulk and tensor copies (spio/thread/bulk_copy.h) exist from sm_90; a suffixed arch
    (sm_90a, sm_100f) counts by its number."""
    from spio.compiler.arch import has_bulk_copies

    assert [has_bulk_copies(a) for a in ("sm_80", "sm_86", "sm_89")] == [False] * 3
    assert [has_bulk_copies(a) for a in ("sm_90", "sm_90a", "sm_100f", "sm_120")] == [True] * 4
