"""The read-bandwidth probe kernel (spio/src/read_probe.cu): how fast a GPU reads through the load
paths spio's kernels use, for scripts/read_probe.py. A diagnostic; the convolutions do not use it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..generators import MacroSpec, ParamsSpec, generate
from ..kernels.kernel import Kernel

#: How a block reads its region (the source's leading comment says more).
MODES = {"ldg": 0, "cp.async": 1, "rows": 2, "bulk": 3}

#: Modes that read in rows of `row_bytes`.
ROW_MODES = ("rows", "bulk")


@dataclass(frozen=True)
class Probe:
    """One probe launch: `blocks` blocks of `threads` threads; block b reads `region_bytes` bytes
    at byte offset b * `region_stride` of the input with `mode`, keeping `depth` loads (ldg),
    copies (cp.async) or rows (rows and bulk, of `row_bytes`) in flight. Mode bulk needs sm_90.
    `groups` (mode rows): a row's 16-byte chunks land in shared memory as the convolutions stage
    an input row, chunk c (pixel c // groups, channel group c % groups) at (c % groups) * pitch
    + c // groups, the pitch the row's pixels rounded up to odd; 0 keeps them in order."""

    mode: str
    blocks: int
    threads: int
    depth: int
    region_bytes: int
    region_stride: int
    row_bytes: int = 0
    groups: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Probe mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("blocks", "threads", "depth", "region_bytes", "region_stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"Probe needs {name} >= 1, got {getattr(self, name)}")
        if self.threads % 32 or self.threads > 1024:
            raise ValueError(f"Probe needs threads a multiple of 32 up to 1024, got {self.threads}")
        if self.depth < 2 and self.mode != "ldg":
            raise ValueError(f"Probe mode {self.mode} needs depth >= 2, got {self.depth}")
        if self.region_bytes % 16 or self.region_stride % 16:
            raise ValueError(
                f"Probe needs region_bytes and region_stride multiples of 16, got "
                f"{self.region_bytes} and {self.region_stride}"
            )
        if self.mode in ROW_MODES and (
            self.row_bytes < 16 or self.row_bytes % 16 or self.region_bytes % self.row_bytes
        ):
            raise ValueError(
                f"Probe mode {self.mode} needs row_bytes a multiple of 16 dividing region_bytes "
                f"{self.region_bytes}, got {self.row_bytes}"
            )
        if self.groups and (
            self.groups < 0 or self.mode != "rows" or self.row_chunks % self.groups
        ):
            raise ValueError(
                f"Probe groups need mode rows and a row of 16-byte chunks that they divide, got "
                f"{self.groups} groups, mode {self.mode}, {self.row_chunks} chunks a row"
            )
        if self.mode == "bulk" and self.row_bytes >= 1 << 20:
            raise ValueError(f"Probe mode bulk needs rows under 1 MiB, got {self.row_bytes} bytes")
        if self.span_bytes >= 2**31:
            raise ValueError(f"Probe reads at most 2 GiB, got a span of {self.span_bytes} bytes")

    @property
    def span_bytes(self) -> int:
        """Bytes from the input's start to the end of the last block's region."""
        return (self.blocks - 1) * self.region_stride + self.region_bytes

    @property
    def read_bytes(self) -> int:
        return self.blocks * self.region_bytes

    @property
    def row_chunks(self) -> int:
        return self.row_bytes // 16

    @property
    def pitch(self) -> int:
        """With groups, the 16-byte chunks from one group's pixel run of a row buffer to the
        next: the row's pixels rounded up to odd (the kernel reads it from its header)."""
        return (self.row_chunks // self.groups) | 1 if self.groups else 0

    @property
    def stage_chunks(self) -> int:
        """16-byte chunks of one row buffer (mode rows): the row's, or with groups the groups'
        pixel runs, each `pitch` long."""
        return self.groups * self.pitch if self.groups else self.row_chunks

    @property
    def shared_mem_bytes(self) -> int:
        if self.mode == "cp.async":
            return self.depth * self.threads * 16
        if self.mode == "rows":
            return self.depth * self.stage_chunks * 16
        if self.mode == "bulk":
            return self.depth * (self.row_bytes + 8)  # the buffers, then one mbarrier each
        return 0

    def label(self) -> str:
        row = f" rows of {self.row_bytes} B" if self.mode in ROW_MODES else ""
        row += f" as {self.groups} groups" if self.groups else ""
        return (
            f"{self.mode:8s} depth {self.depth}{row}, {self.blocks} blocks x {self.threads}, "
            f"{self.region_bytes >> 10} KiB each every {self.region_stride >> 10} KiB"
        )

    def kernel(self) -> Kernel:
        """The probe's kernel (made once per probe: calls are timed back to back)."""
        return _kernel(self)

    def run(self, data, out=None):
        """Launch on `data` (a uint8 tensor of at least span_bytes, 16-byte aligned, on a GPU or
        the CPU for the emulator); returns the per-thread XORs (blocks x threads int32), in
        `out` if given."""
        import torch

        if data.dtype != torch.uint8 or data.numel() < self.span_bytes or data.data_ptr() % 16:
            raise ValueError(
                f"Probe needs a 16-byte aligned uint8 tensor of at least {self.span_bytes} bytes, "
                f"got {data.dtype} of {data.numel()} at {data.data_ptr():#x}"
            )
        threads = self.blocks * self.threads
        if out is None:
            out = torch.empty(threads, dtype=torch.int32, device=data.device)
        elif out.dtype != torch.int32 or out.numel() < threads or out.device != data.device:
            raise ValueError(  # the kernel writes one int32 a thread
                f"Probe needs out as an int32 tensor of at least {threads} elements on "
                f"{data.device}, got {out.dtype} of {out.numel()} on {out.device}"
            )
        self.kernel().launch([out, data], data.device)
        return out


@functools.lru_cache(maxsize=256)
def _kernel(probe: Probe) -> Kernel:
    header = generate(
        [
            MacroSpec({"SPIO_PROBE_MODE": MODES[probe.mode]}),
            ParamsSpec(
                "Probe",
                {
                    "blocks": probe.blocks,
                    "threads": probe.threads,
                    "depth": probe.depth,
                    "region_bytes": probe.region_bytes,
                    "region_stride": probe.region_stride,
                    "row_bytes": max(probe.row_bytes, 16),
                    "groups": probe.groups,
                    "pitch": probe.pitch,
                    "stage_chunks": probe.stage_chunks,
                },
            ),
        ]
    )
    name = (
        f"read_probe__{probe.mode.replace('.', '')}_b{probe.blocks}_t{probe.threads}"
        f"_d{probe.depth}_r{probe.region_bytes}_s{probe.region_stride}_w{probe.row_bytes}"
        + (f"_g{probe.groups}" if probe.groups else "")
    )
    return Kernel(
        name=name,
        source_file="read_probe.cu",
        entry="spio_read_probe",
        headers=(("read_probe_gen.h", header),),
        grid=(probe.blocks, 1, 1),
        block=(probe.threads, 1, 1),
        shared_mem_bytes=probe.shared_mem_bytes,
        info=(("probe", probe),),
    )
