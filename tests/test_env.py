"""spio.env.flag: the one reading of the on/off settings (SPIO_EMULATE, SPIO_AUTOTUNE,
SPIO_EMU_UCONTEXT); a value that is neither on nor off raises instead of reading as off. And
spio.env.choice (SPIO_TMA): a value outside its choices raises, naming them."""

import pytest

from spio.env import flag


@pytest.mark.parametrize("value", ["1", "true", " Yes ", "ON", "on"])
def test_on_words(monkeypatch, value):
    monkeypatch.setenv("SPIO_TEST_FLAG", value)
    assert flag("SPIO_TEST_FLAG") is True


@pytest.mark.parametrize("value", ["0", "false", " No ", "OFF", "", "  "])
def test_off_words_and_unset(monkeypatch, value):
    monkeypatch.setenv("SPIO_TEST_FLAG", value)
    assert flag("SPIO_TEST_FLAG") is False
    monkeypatch.delenv("SPIO_TEST_FLAG")
    assert flag("SPIO_TEST_FLAG") is False


@pytest.mark.parametrize("value", ["maybe", "2", "enable", "y", " Nope "])
def test_other_values_raise_naming_setting_value_and_words(monkeypatch, value):
    monkeypatch.setenv("SPIO_TEST_FLAG", value)
    with pytest.raises(ValueError) as info:
        flag("SPIO_TEST_FLAG")
    assert str(info.value) == (
        f"SPIO_TEST_FLAG must be 1/true/yes/on or 0/false/no/off, got {value!r}"
    )


def test_a_choice_is_one_of_its_values(monkeypatch):
    from spio.env import choice

    monkeypatch.delenv("SPIO_TEST_CHOICE", raising=False)
    assert choice("SPIO_TEST_CHOICE", ("off", "a", "b+c")) == "off"
    for text, value in (("", "off"), (" A ", "a"), ("B+C", "b+c")):
        monkeypatch.setenv("SPIO_TEST_CHOICE", text)
        assert choice("SPIO_TEST_CHOICE", ("off", "a", "b+c")) == value
    monkeypatch.setenv("SPIO_TEST_CHOICE", "d")
    with pytest.raises(ValueError, match=r"^SPIO_TEST_CHOICE must be off, a or b\+c, got 'd'$"):
        choice("SPIO_TEST_CHOICE", ("off", "a", "b+c"))


def test_an_integer_past_pythons_digit_limit_is_named_as_the_others():
    """int() refuses over 4300 digits with its own message, which named no setting."""
    import os

    from spio.env import integer

    os.environ["SPIO_TEST_INT"] = "9" * 5000
    try:
        with pytest.raises(ValueError, match=r"^SPIO_TEST_INT must be an integer, got '9999"):
            integer("SPIO_TEST_INT")
    finally:
        del os.environ["SPIO_TEST_INT"]


def test_path_settings_are_absolute_expanded_and_blank_is_unset(monkeypatch, tmp_path):
    """A relative SPIO_NVRTC had been checked against the current folder and then given, bare,
    to the dynamic loader, which searched its own path instead (loading another NVRTC); `~`
    was not expanded, and spaces named a file " "."""
    from spio.env import path, path_or_name, path_shown

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for text in ("", "  "):
        monkeypatch.setenv("SPIO_TEST_PATH", text)
        assert path("SPIO_TEST_PATH") is None and path_or_name("SPIO_TEST_PATH") is None
    monkeypatch.delenv("SPIO_TEST_PATH")
    assert path("SPIO_TEST_PATH") is None
    for text, want in (
        ("./lib/x.so", tmp_path / "lib/x.so"),
        ("x.so ", tmp_path / "x.so"),
        ("~/x.so", tmp_path / "home/x.so"),
        (str(tmp_path / "a/../b"), tmp_path / "b"),
    ):
        monkeypatch.setenv("SPIO_TEST_PATH", text)
        assert path("SPIO_TEST_PATH") == want
    # A library's or program's bare name is the loader's or PATH's to find.
    for text, want in (
        ("libcuda.so.1", "libcuda.so.1"),
        (" nvdisasm ", "nvdisasm"),
        ("./libcuda.so", str(tmp_path / "libcuda.so")),
        ("~/bin/nvdisasm", str(tmp_path / "home/bin/nvdisasm")),
    ):
        monkeypatch.setenv("SPIO_TEST_PATH", text)
        assert path_or_name("SPIO_TEST_PATH") == want
    monkeypatch.setenv("SPIO_TEST_PATH", "x.so")
    assert path_shown("SPIO_TEST_PATH") == f"SPIO_TEST_PATH='x.so' ({tmp_path / 'x.so'})"
    monkeypatch.setenv("SPIO_TEST_PATH", str(tmp_path))
    assert path_shown("SPIO_TEST_PATH") == f"SPIO_TEST_PATH={str(tmp_path)!r}"
