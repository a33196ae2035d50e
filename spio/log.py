"""The "spio" logger. SPIO_LOGGER=1 shows info messages on stderr, SPIO_LOGGER=2 debug messages."""

import logging
import os

logger = logging.getLogger("spio")


def _configure_from_env() -> None:
    level = {"1": logging.INFO, "2": logging.DEBUG}.get(os.environ.get("SPIO_LOGGER", "").strip())
    if level is None:
        return
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("spio %(levelname)s: %(message)s"))
        logger.addHandler(handler)


_configure_from_env()
