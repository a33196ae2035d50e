"""SPIO_LOGGER, read at `import spio`: 1 logs info, 2 debug, 0 or empty nothing; another value
warns (naming it and the accepted ones) rather than being ignored or breaking the import."""

import logging
import os
import subprocess
import sys
import warnings

import pytest

from spio import log


@pytest.fixture
def spio_logger(monkeypatch):
    """The spio logger's level and handlers, restored after the test."""
    monkeypatch.setattr(log.logger, "level", log.logger.level)
    monkeypatch.setattr(log.logger, "handlers", list(log.logger.handlers))
    log.logger.setLevel(logging.NOTSET)
    return log.logger


def _run(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`args` run in a fresh process, with `env` added to this one's environment; its output
    as text."""
    return subprocess.run(
        args, capture_output=True, encoding="utf-8", timeout=timeout, env=dict(os.environ, **env)
    )


@pytest.mark.parametrize("value,level", [("1", logging.INFO), (" 2 ", logging.DEBUG)])
def test_levels(monkeypatch, spio_logger, value, level):
    monkeypatch.setenv("SPIO_LOGGER", value)
    log._configure_from_env()
    assert spio_logger.level == level and spio_logger.handlers


def test_configuring_again_adds_no_second_handler(monkeypatch, spio_logger):
    monkeypatch.setenv("SPIO_LOGGER", "1")
    spio_logger.handlers.clear()
    log._configure_from_env()
    log._configure_from_env()
    assert len(spio_logger.handlers) == 1  # each line logged once


@pytest.mark.parametrize("value", ["", "0"])
def test_off_is_quiet(monkeypatch, spio_logger, value):
    monkeypatch.setenv("SPIO_LOGGER", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log._configure_from_env()
    assert spio_logger.level == logging.NOTSET


@pytest.mark.parametrize("value", ["7", "debug", "true"])
def test_a_bad_value_warns_and_keeps_the_default_level(monkeypatch, spio_logger, value):
    monkeypatch.setenv("SPIO_LOGGER", value)
    with pytest.warns(UserWarning) as record:
        log._configure_from_env()
    assert len(record) == 1
    message = str(record[0].message)
    assert message.startswith("SPIO_LOGGER ") and repr(value) in message
    assert all(word in message for word in ("0", "1", "2"))
    assert spio_logger.level == logging.NOTSET


def test_import_spio_with_a_bad_value_warns_and_works():
    out = _run([sys.executable, "-c", "import spio; print(spio.__version__)"], SPIO_LOGGER="debug")
    assert out.returncode == 0, out.stderr
    assert "SPIO_LOGGER must be" in out.stderr and "'debug'" in out.stderr


def test_the_bad_value_warning_names_the_users_import_line(tmp_path):
    """Not spio's own line in spio/log.py: the user's `import` that read the setting, through
    whichever of spio's modules it imported first."""
    lines = (
        "import spio",
        "import spio.functional",
        "from spio.layers import Conv2dGw8",
        "import importlib; importlib.import_module('spio')",  # (had named importlib's line)
    )
    folder = tmp_path / "runpy_project"  # (a path naming runpy had been taken for python -m)
    folder.mkdir()
    for line in lines:
        script = folder / "user_script.py"
        script.write_text(f"x = 1\n{line}\n")
        out = _run([sys.executable, str(script)], SPIO_LOGGER="debug")
        assert out.returncode == 0, out.stderr
        assert f"{script}:2: UserWarning: SPIO_LOGGER must be" in out.stderr, out.stderr


def test_the_bad_value_warning_is_shown_once_by_a_command_with_compile_workers(tmp_path):
    """Each compile worker imports spio: it had warned again, once per worker, through the
    command's progress bar."""
    out = _run(
        [sys.executable, "-m", "spio", "compile", "--sample", "2", "--arch", "sm_90"],
        timeout=600,
        SPIO_LOGGER="debug",
        SPIO_WORKERS="2",
        SPIO_CACHE_DIR=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("SPIO_LOGGER must be") == 1, out.stderr


def test_a_line_logged_during_a_progress_bar_starts_on_a_line_of_its_own():
    """spio's handler clears tqdm's bars on its stream around each line (a warning during a
    compile sweep had been printed onto the bar's line), and draws them again after it."""
    import io

    from tqdm import tqdm

    stream = io.StringIO()
    handler = log._StderrHandler(stream)
    record = logging.LogRecord("spio", logging.WARNING, __file__, 1, "hello", None, None)
    with tqdm(total=10, file=stream, mininterval=0, ascii=True) as bar:
        bar.update(1)
        handler.emit(record)
        before, after = stream.getvalue().split("spio WARNING: hello\n")
    assert before.endswith("\r") and "1/10" in after  # the bar cleared, then drawn again


def test_the_command_line_shows_warnings_off_the_progress_bars(tmp_path):
    """Where SPIO_LOGGER sets no handler, the `spio` program's warnings went through Python's
    last-resort handler, onto a progress bar's line ("...4.28kernel/s]spio cannot write its
    cache folder"). The program shows them through spio's handler, which clears the bars."""
    afile = tmp_path / "afile"
    afile.touch()
    out = _run(
        [sys.executable, "-m", "spio", "compile", "--arch", "sm_90", "--sample", "2"],
        timeout=300,
        SPIO_CACHE_DIR=str(afile),
        SPIO_LOGGER="",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stderr.replace("\r", "\n").splitlines()
    (warning,) = [line for line in lines if "cannot write its cache folder" in line]
    assert warning.startswith("spio WARNING: spio cannot write its cache folder"), warning


def test_a_library_adds_no_handler_for_warnings(monkeypatch, spio_logger):
    """Only the program shows warnings through a handler of spio's: imported, spio leaves
    that to the application (a library's handlers would print what its own logging config
    routes elsewhere)."""
    monkeypatch.setenv("SPIO_LOGGER", "")
    spio_logger.handlers.clear()
    log._configure_from_env()
    assert spio_logger.handlers == []
    log.show_warnings()
    log.show_warnings()
    (handler,) = spio_logger.handlers
    assert handler.level == logging.WARNING


def test_the_spio_command_shows_the_bad_value_as_its_other_warnings():
    """Under `python -m spio` (and the console script) the warning had been Python's, naming
    spio's own line in spio/log.py; the command's warnings are `spio WARNING:` lines."""
    for command in (
        [sys.executable, "-m", "spio"],
        [os.path.join(os.path.dirname(sys.executable), "spio")],
    ):
        if not os.path.exists(command[0]):
            continue
        out = _run([*command, "--version"], SPIO_LOGGER="debug")
        assert out.returncode == 0, out.stderr
        assert out.stderr == (
            "spio WARNING: SPIO_LOGGER must be 0 or empty (off), 1 (info) or 2 (debug), got "
            "'debug'; spio logs at the default level\n"
        ), (command, out.stderr)
    # `python -m` of another of spio's modules has no command to show it: Python's warning
    # (the command's deferral had lost it there).
    out = _run([sys.executable, "-m", "spio.bench.sanitize"], SPIO_LOGGER="debug")
    assert "UserWarning: SPIO_LOGGER must be" in out.stderr, out.stderr


def test_progress_bars_redraw_rarely_where_their_stream_is_no_terminal():
    """tqdm redraws every 0.1 s: into a CI log or a file that is ten frames a second of one
    line (`spio check --quick` wrote 2.5 KB of them in 12 s; a long `spio compile`, megabytes).
    Where the stream is no terminal spio's bars redraw every NON_TTY_INTERVAL seconds, still
    showing their first and last frames; on a terminal as tqdm does."""
    import io
    import time

    from spio.log import NON_TTY_INTERVAL, progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, interval in ((io.StringIO(), NON_TTY_INTERVAL), (Terminal(), 0.1)):
        with progress_bar(total=40, file=stream, desc="work", ascii=True) as bar:
            assert bar.mininterval == interval
            for _ in range(40):
                time.sleep(0.01)
                bar.update()
        frames = stream.getvalue().count("work:")
        if interval == NON_TTY_INTERVAL:
            assert frames == 2, stream.getvalue()  # 0/40 and 40/40
        else:
            assert frames > 2
    assert progress_bar(total=1, file=io.StringIO(), mininterval=1).mininterval == 1
