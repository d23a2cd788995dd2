"""Two DDP steps with commsgd_torch's top-k hook on every rank of an emulated cluster (run by `netcluster run`,
which sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME).

Exit status 0 when every rank ends with the same parameters bit for bit and the hook sent bytes; the gloo group
is reached through MASTER_ADDR, so every byte crosses the shaped links."""
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import commsgd_torch


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)  # the same start everywhere; DDP also broadcasts rank 0's parameters
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    ddp = DistributedDataParallel(model)
    state = commsgd_torch.TopKState(model=model, density=0.1)
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch, so the exchange matters
    for _ in range(2):
        x, y = torch.randn(16, 64, generator=data), torch.randint(0, 10, (16,), generator=data)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    same = all(torch.equal(every[0].view(torch.int32), e.view(torch.int32)) for e in every)
    sent = state.traffic()["bytes_sent"]
    dist.destroy_process_group()
    if not same:
        print(f"rank {rank}: parameters differ between ranks after two steps", flush=True)
        return 1
    if sent == 0:
        print(f"rank {rank}: the top-k hook sent nothing", flush=True)
        return 1
    print(f"rank {rank}: 2 DDP steps with topk_hook over {os.environ.get('GLOO_SOCKET_IFNAME')}, "
          f"parameters equal on {world} ranks, hook sent {sent} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
