"""Jobs for the compile pool's tests. They live in a module of their own, importable as
`tests.compiler.pool_jobs`, because worker processes unpickle a job by importing its class."""

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from spio.compiler import CompileJob


@dataclass(frozen=True)
class KillWorkerJob(CompileJob):
    """Kills the process that runs it, as an NVRTC crash or the OOM killer would. Never run it
    with workers=1: that process is the caller's."""

    def run(self):
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class MarkJob(CompileJob):
    """Sleeps 0.2 s, then leaves an empty file called `name` in the folder `source`: the files
    there say which jobs ran."""

    def run(self):
        time.sleep(0.2)
        Path(self.source, self.name).touch()
        return self.name
