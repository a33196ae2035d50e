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
