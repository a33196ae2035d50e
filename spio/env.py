"""Reading spio's environment settings: one parser for the on/off flags, so that all accept the
same words and reject the rest."""

import os

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def flag(name: str) -> bool:
    """The on/off setting `name`: 1/true/yes/on is True; 0/false/no/off, empty or unset is False
    (any case, spaces ignored); any other value raises ValueError naming the setting and value."""
    text = os.environ.get(name, "")
    value = text.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off, got {text!r}")
