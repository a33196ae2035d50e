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


@dataclass(frozen=True)
class HangOnTermJob(CompileJob):
    """Handles SIGTERM by waiting forever, as NVRTC's handler can (it calls exit() and may
    deadlock on a malloc lock the compile it interrupted holds), then works for a while (a
    compile in progress when its pool breaks)."""

    def run(self):
        signal.signal(signal.SIGTERM, lambda *args: time.sleep(3600))
        Path(self.source, "handler-set").touch()  # (`source` is a folder, as for MarkJob)
        for _ in range(50):  # 5 s; the handler runs between these sleeps
            time.sleep(0.1)
        return self.name


@dataclass(frozen=True)
class KillWorkerWhenReadyJob(CompileJob):
    """KillWorkerJob, once a HangOnTermJob has set its handler (its file in the folder
    `source`), so that the pool breaks while that job runs with its handler in place."""

    def run(self):
        for _ in range(300):
            if Path(self.source, "handler-set").exists():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class SigintStateJob(CompileJob):
    """Returns how the worker running it treats SIGINT: (ignored, blocked)."""

    def run(self):
        blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        return signal.getsignal(signal.SIGINT) is signal.SIG_IGN, blocked
