"""A small data-parallel training loop on the CPU, annotated with NVTX, for the pack's sample reports.

Each rank trains an MLP on random data; gradients are summed with an explicit gloo all_reduce inside
the `allreduce` range, so a rank that arrives late makes the others wait there. One rank can be made
slow on purpose: an extra sleep inside its `dataloader` range in a stretch of iterations.

Run by scripts/make_cpu_samples.py under `nsys profile`; needs torch and nvtx==0.2.11.
"""

import argparse
import os
import time

import nvtx
import torch
import torch.distributed as dist


def parse_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=60, help="profiled steps (each an NVTX range `step`)")
    p.add_argument("--warmup", type=int, default=3, help="steps before the profiled ones, without NVTX")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--slow-iterations", type=parse_range, default=parse_range("20-29"))
    p.add_argument("--slow-ms", type=float, default=40.0)
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())

    def step(i: int, annotate: bool) -> None:
        def rng(name):
            return nvtx.annotate(name) if annotate else _Null()

        with rng("dataloader"):
            x = torch.randn(args.batch, args.hidden)
            y = torch.randint(0, 10, (args.batch,))
            if annotate and rank == args.slow_rank and i in args.slow_iterations:
                time.sleep(args.slow_ms / 1000.0)  # the injected stall
        with rng("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with rng("backward"):
            opt.zero_grad(set_to_none=False)
            loss.backward()
        with rng("allreduce"):
            flat = torch.cat([q.grad.reshape(-1) for q in params])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for q in params:
                n = q.grad.numel()
                q.grad.copy_(flat[offset:offset + n].view_as(q.grad))
                offset += n
        with rng("optimizer"):
            opt.step()

    for i in range(args.warmup):
        step(i, annotate=False)
    dist.barrier()
    for i in range(args.steps):
        with nvtx.annotate("step"):
            step(i, annotate=True)
    dist.barrier()
    dist.destroy_process_group()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
