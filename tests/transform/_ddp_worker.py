"""Two gloo ranks train a transformed ConvNet a few steps; rank 0 checks parameters stay in sync.

Run as a script (tests/transform/test_ddp.py does): python _ddp_worker.py INIT_FILE RESULT_FILE.
Each rank sees different data, so only DDP's gradient all-reduce keeps their parameters equal.
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD_SIZE = 2
STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 1),
        nn.Conv2d(16, 16, 3, padding=1, groups=2),
        nn.ReLU(),
        nn.Conv2d(16, 16, 5, padding=2, groups=2, bias=False),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 4),
    )


def _run(rank: int, init_file: str, result_file: str) -> None:
    import spio
    import spio.transform
    from spio.layers import Conv2dGw8

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = spio.transform.transform(_model())
        assert sum(isinstance(m, Conv2dGw8) for m in model.modules()) == 2
        initial = [p.detach().clone() for p in model.parameters()]
        ddp = nn.parallel.DistributedDataParallel(model)
        # precompile runs the module inside DDP (whose own forward would broadcast buffers and
        # prepare a gradient reduction that no backward follows); training goes on unharmed.
        spio.precompile(ddp, torch.randn(4, 3, 8, 8), progress=False)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(STEPS):
            x = torch.randn(4, 3, 8, 8, generator=gen)
            target = torch.randint(0, 4, (4,), generator=gen)
            loss = nn.functional.cross_entropy(ddp(x), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(WORLD_SIZE)]
        dist.all_gather(gathered, flat)
        if rank == 0:
            moved = min(
                (p.detach() - q).abs().max().item()
                for p, q in zip(model.parameters(), initial, strict=True)
            )
            diff = (gathered[0] - gathered[1]).abs().max().item()
            with open(result_file, "w") as f:
                f.write(f"{diff} {moved}\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    # fork: this fresh script has started no threads, and the ranks skip re-importing torch.
    mp.start_processes(
        _run, args=(sys.argv[1], sys.argv[2]), nprocs=WORLD_SIZE, join=True, start_method="fork"
    )
