"""A 2-process DDP run of the MLP on 2,000 Fashion-MNIST images with commsgd's top-k hook learns."""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import commsgd_torch
from helpers import fashion_mnist, mlp, run_ranks


def _train(rank, world, selector):
    torch.manual_seed(0)
    x, y = fashion_mnist("train", 2000)
    xt, yt = fashion_mnist("test", 1000)
    mine = slice(rank * 1000, (rank + 1) * 1000)  # each rank its own half
    x, y = x[mine], y[mine]
    model = mlp()
    ddp = DDP(model)
    state = commsgd_torch.TopKState(model=model, density=0.01, selector=selector, momentum=0.9, start_iter=5)
    ddp.register_comm_hook(state, commsgd_torch.topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    steps = 0
    for epoch in range(6):
        order = torch.randperm(1000, generator=g)
        for b in range(0, 1000, 50):
            i = order[b:b + 50]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x[i]), y[i]).backward()
            opt.step()
            steps += 1
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    traffic = state.traffic()
    return acc, traffic["bytes_sent"] / steps


def test_mlp_on_2000_fashion_mnist_images_reaches_60_percent():
    results = run_ranks(_train, 2, ("laplace_bisect",), timeout=400)
    (acc0, bytes0), (acc1, bytes1) = results
    print(f"test accuracy {acc0:.3f} (rank 0), {acc1:.3f} (rank 1); bytes sent per step {bytes0:.0f}")
    assert acc0 == acc1  # replicas stay identical: every rank applies the same averaged gradient
    assert acc0 >= 0.6
    dense = 4 * sum(p.numel() for p in mlp().parameters())
    assert bytes0 < 0.2 * dense  # and top-k moved far less than a dense all-reduce would
