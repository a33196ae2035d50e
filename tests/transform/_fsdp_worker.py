"""Two gloo ranks wrap a model in FSDP, transform it before or after, and train a few steps.

Run as a script (tests/transform/test_fsdp.py does): python _fsdp_worker.py INIT_FILE RESULT_FILE
MODE DTYPE, MODE "fsdp1" (FullyShardedDataParallel, use_orig_params=True), "fsdp1-flat" (the same
with use_orig_params=False) or "fsdp2" (fully_shard on the root alone), DTYPE "float64" or
"bfloat16" (spio's kernels run with SPIO_EMULATE=1). The wrappers swap each layer's full weight in
at its call, on the module object they wrapped. After wrapping, spio.transform must leave those
layers (whose weights are shards, or plain tensors) alone, and spio.untransform must refuse,
rather than put modules in that keep the shards. Rank 0 writes, for a model transformed after
wrapping and one transformed before (with a refused untransform after), the largest difference
from the same steps without spio and from the other rank, how many layers are Conv2dGw8 in each,
and how many spio kernels its steps launched; then the largest parameter's magnitude.
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD_SIZE = 2
STEPS = 2


def _model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(16, 16, 3, padding=1, groups=2),
        nn.ReLU(),
        nn.Conv2d(16, 16, 1, groups=2, bias=False),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 4),
    ).to(dtype)


def _train(
    mode: str, dtype: torch.dtype, rank: int, transform: str
) -> tuple[torch.Tensor, int, int]:
    """The parameters after STEPS steps, the number of Conv2dGw8 layers and of spio kernel
    launches; transform: "", "after" wrapping, or "before" (and an untransform after wrapping,
    which must refuse)."""
    import spio
    from spio.kernels.kernel import Kernel
    from spio.layers import Conv2dGw8

    launches = [0]
    launch = Kernel.launch

    def counted(self, args, device):
        launches[0] += 1
        return launch(self, args, device)

    Kernel.launch = counted

    model = _model(dtype)
    if transform == "before":
        spio.transform(model)
    if mode.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = FullyShardedDataParallel(
            model, use_orig_params=mode == "fsdp1", device_id=torch.device("cpu")
        )
    else:
        from torch.distributed.fsdp import fully_shard

        wrapped = fully_shard(model)
    if transform == "after":
        spio.transform(model)
    if transform == "before":
        try:
            spio.untransform(model)
        except ValueError:
            pass
        else:
            raise AssertionError("untransform after wrapping did not refuse")
    spio_layers = sum(isinstance(m, Conv2dGw8) for m in model.modules())
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(2, 16, 6, 5, generator=gen, dtype=dtype)
        target = torch.randint(0, 4, (2,), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(wrapped(x), target).backward()
        optimizer.step()
    Kernel.launch = launch
    if mode.startswith("fsdp1"):
        with FullyShardedDataParallel.summon_full_params(wrapped):
            params = torch.cat([p.detach().flatten() for p in model.parameters()])
            return params, spio_layers, launches[0]
    params = torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()])
    return params, spio_layers, launches[0]


def _run(rank: int, init_file: str, result_file: str, mode: str, dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        plain, _, _ = _train(mode, dtype, rank, transform="")
        lines = []
        for when in ("after", "before"):
            params, spio_layers, launches = _train(mode, dtype, rank, transform=when)
            gathered = [torch.empty_like(params) for _ in range(WORLD_SIZE)]
            dist.all_gather(gathered, params)
            diff = (params - plain).abs().max().item()
            ranks = (gathered[0] - gathered[1]).abs().max().item()
            lines.append(f"{when} {diff} {ranks} {spio_layers} {launches}\n")
        if rank == 0:
            with open(result_file, "w") as f:
                f.writelines([*lines, f"{plain.abs().max().item()}\n"])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.start_processes(
        _run, args=tuple(sys.argv[1:5]), nprocs=WORLD_SIZE, join=True, start_method="fork"
    )
