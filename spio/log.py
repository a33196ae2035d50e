"""The "spio" logger. SPIO_LOGGER=1 shows info messages on stderr, SPIO_LOGGER=2 debug messages."""

import logging
import os
import sys
import types
import warnings

logger = logging.getLogger("spio")

#: Set in the environment that compile workers start with (spio.compiler.pool): their `import
#: spio` does not warn again of what the parent's warned of (a malformed SPIO_LOGGER, once per
#: worker, through the command's progress bar). Not SPIO_-prefixed: no setting of the user's.
WORKER_MARK = "_SPIO_COMPILE_WORKER"


class _StderrHandler(logging.StreamHandler):
    """stderr, clearing tqdm's progress bars there around each line (tqdm.external_write_mode),
    so that a log line never lands on a bar's line; plain writes while tqdm is not imported.
    Its stream: `stream`, or else sys.stderr as it is at each line (a test's capture, a
    redirect)."""

    def __init__(self, stream=None) -> None:
        self._given = stream
        super().__init__(stream)
        self.setFormatter(logging.Formatter("spio %(levelname)s: %(message)s"))

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr if self._given is None else self._given

    @stream.setter
    def stream(self, value) -> None:
        pass  # (StreamHandler.__init__ sets it)

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = sys.modules.get("tqdm")  # no bars can exist before tqdm is imported
        if tqdm is None:
            super().emit(record)
            return
        with tqdm.tqdm.external_write_mode(file=self.stream):
            super().emit(record)


_LEVELS = {"": None, "0": None, "1": logging.INFO, "2": logging.DEBUG}


def _configure_from_env() -> None:
    """Set the level from SPIO_LOGGER; another value warns (it is read at `import spio`, where
    raising would break the import) and leaves the default level."""
    global command_warning
    problem = logger_setting_problem()
    if problem and WORKER_MARK in os.environ:
        return  # a compile worker: its parent has warned
    if problem:
        message = f"{problem}; spio logs at the default level"
        stacklevel = _first_outside()
        if stacklevel == 0:  # the spio command: it warns as its other warnings, `spio WARNING:`
            command_warning = message
        else:
            warnings.warn(message, stacklevel=stacklevel)
        return
    text = os.environ.get("SPIO_LOGGER", "")
    level = _LEVELS[text.strip()]
    if level is None:
        return
    logger.setLevel(level)
    _add_handler(logging.NOTSET)


#: The bad-setting warning the `spio` command shows once it has set its handler (spio.__main__),
#: where `import spio` came from the command itself; None otherwise.
command_warning: str | None = None


def _first_outside() -> int:
    """The stacklevel, for a warning raised by our caller, of the first frame outside spio (the
    user's `import spio`, not spio's own line), counted as warnings.warn counts: the import
    system's frames are passed over. 0 where the import is the `spio` command's own (`python
    -m spio`, or the console script named spio), which has no line of the user's and shows the
    warning itself; 1 (spio's own line) under `python -m` of another of spio's modules."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: types.FrameType | None = sys._getframe(2)  # our caller's caller: stacklevel 2
    level = 2
    while frame is not None:
        name = frame.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:  # (not counted by warnings.warn)
            frame = frame.f_back
            continue
        module = frame.f_globals.get("__name__", "")
        if module == "runpy":  # python -m: the spio command's (its __main__), or another's
            return 0 if frame.f_locals.get("mod_name") == "spio.__main__" else 1
        if module == "__main__" and os.path.basename(name) == "spio":  # the console script
            return 0
        if module != "importlib" and not os.path.abspath(name).startswith(package):
            return level  # (importlib.import_module's frame is counted, and passed over)
        frame, level = frame.f_back, level + 1
    return 1


def show_warnings() -> None:
    """Warnings on stderr through the handler that clears progress bars, where SPIO_LOGGER has
    set none: for the command line, whose bars a warning would otherwise share a line with
    (Python's last-resort handler writes the bare message). A library adds no handler."""
    _add_handler(logging.WARNING)


def _add_handler(level: int) -> None:
    """spio's stderr handler at `level`, unless the logger has a handler already."""
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setLevel(level)
        logger.addHandler(handler)


#: Seconds between a progress bar's redraws where its stream is not a terminal (a CI log, a
#: file): tqdm's 0.1 s there wrote a frame ten times a second, which a long `spio compile` turns
#: into megabytes of one line. A bar still shows its first and last frames.
NON_TTY_INTERVAL = 30.0


def progress_bar(*args, **kwargs):
    """tqdm.tqdm(*args, **kwargs), redrawn at most every NON_TTY_INTERVAL seconds where its
    stream (`file`, else stderr) is not a terminal, unless `mininterval` is given: spio's
    progress bars, one rule for all."""
    import tqdm

    stream = kwargs.get("file") or sys.stderr
    isatty = getattr(stream, "isatty", None)
    if "mininterval" not in kwargs and not (isatty is not None and isatty()):
        kwargs["mininterval"] = NON_TTY_INTERVAL
    return tqdm.tqdm(*args, **kwargs)


def logger_setting_problem() -> str | None:
    """What is wrong with SPIO_LOGGER's value, or None where it is one of the levels."""
    text = os.environ.get("SPIO_LOGGER", "")
    if text.strip() in _LEVELS:
        return None
    return f"SPIO_LOGGER must be 0 or empty (off), 1 (info) or 2 (debug), got {text!r}"


_configure_from_env()
