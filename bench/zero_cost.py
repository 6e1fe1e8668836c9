"""What a converted model costs where ucudnn cannot gain: compiled, exported, per call, and under
DistributedDataParallel. (Eager training with memory free is bench/train_ab.py --limits auto.)

Sections (--sections, default all but ddp):
- `compile`: torch.compile(fullgraph=True, dynamic=False, Inductor) of torchvision ResNet-50, AMP
  channels_last B=32, memory free: torch's model and its converted copy (convert's defaults: most
  layers delegated, so its graph is torch's), each compiled, trained in alternating rounds with an
  A/A control (a second compiled copy of torch's model); the first step's loss and gradients of
  each compiled copy against eager torch on the same weights and batch. Then a converted ResNet-18
  fp32 B=32 with every layer through ucudnn at --tight (micro-batched), compiled: its loss over
  --iters steps and one step's gradients against the same model eager.
- `export`: torch.export of that micro-batched ResNet-18 (eval): whether ucudnn's op is in the
  program, and its output against eager.
- `host`: host microseconds per layer call of a stack of 16 small convolutions (ResNet-50's
  layer3 3x3, AMP channels_last B=8) kept ahead of a busy GPU: torch's layers, converted layers
  left to torch (delegated) and converted layers ucudnn runs (delegate=False); forward with
  gradients and the F+BD+BF step.
- `ddp` (run under torchrun, two or more GPUs): ResNet-18 AMP channels_last B=64 a rank, torch's
  model, its converted copy planned by ucudnn.torch.rank_zero_first and an A/A control, each in
  DistributedDataParallel, trained in alternating rounds; parameters compared across ranks, and
  each rank's planning seconds.

    PYTHONPATH=. python3 bench/zero_cost.py --out OUT [--sections compile,export,host]
    PYTHONPATH=. torchrun --nproc_per_node 2 bench/zero_cost.py --out OUT --sections ddp

Writes OUT/zero_cost.json (and OUT/zero_cost-ddp.json) after each section.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

import ucudnn.torch as ut
from bench.common import build, condensed, median_iteration_ms, relative_error, training_step


def model_of(name: str, batch: int, amp: bool, device):
    """common.build's model, batch and targets, seeded: every section starts from the same weights."""
    torch.manual_seed(0)
    return build(name, batch, amp, device)


def one_step_gradients(model, x, target, amp: bool):
    """The loss and the parameters' gradients (one vector) of one step, loss scaled by 1024 under AMP."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        loss = F.cross_entropy(model(x), target)
    (loss * (1024.0 if amp else 1.0)).backward()
    grads = torch.cat([p.grad.detach().double().flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return loss.detach().double(), grads


def counts(model) -> dict:
    summary = ut.context_of(model).summary()
    brief = condensed(summary)
    return dict({k: brief[k] for k in ("kernels", "delegated", "micro_batched", "runs", "fallbacks")},
                planning_s=summary["planning_s"])


def compiled_resnet50(args) -> dict:
    device, amp = torch.device("cuda"), True
    torch.backends.cudnn.benchmark = True
    model, x, target = model_of("resnet50", 32, amp, device)
    eager = copy.deepcopy(model)
    ours = ut.convert(copy.deepcopy(model), cache_path=args.cache)  # planned as traced (traced.py)
    compiled = {name: torch.compile(m, fullgraph=True, dynamic=False)
                for name, m in (("torch", copy.deepcopy(model)), ("ucudnn", ours), ("control", copy.deepcopy(model)))}
    row: dict = {}
    want_loss, want = one_step_gradients(eager, x, target, amp)
    for name, m in compiled.items():
        began = time.perf_counter()
        loss, got = one_step_gradients(m, x, target, amp)
        row[f"{name}_first_step_s"] = time.perf_counter() - began
        row[f"{name}_loss_rel"], row[f"{name}_grad_rel"] = relative_error(loss, want_loss), relative_error(got, want)
    steps = {name: training_step(m, x, target, amp) for name, m in compiled.items()}
    for _ in range(3):
        for step in steps.values():
            step()
    ms = median_iteration_ms(steps, args.rounds, args.iters)
    eager_ms = median_iteration_ms({"torch": training_step(eager, x, target, amp)}, 3, args.iters)["torch"]
    row.update(ms=ms, eager_torch_ms=eager_ms, ratio=ms["torch"] / ms["ucudnn"], aa=ms["torch"] / ms["control"],
               ucudnn=counts(ours))
    return row


def micro_batched_resnet18(args, device) -> tuple:
    """ResNet-18 fp32 B=32 converted with every layer through ucudnn within --tight, and its twin
    left unconverted (same weights)."""
    model, x, target = model_of("resnet18", 32, False, device)
    ours = ut.convert(copy.deepcopy(model), workspace_limit=args.tight, delegate=False, cache_path=args.cache)
    return model, ours, x, target


def compiled_micro_batched(args) -> dict:
    device = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    _, ours, x, target = micro_batched_resnet18(args, device)
    eager = copy.deepcopy(ours)
    compiled = torch.compile(ours, fullgraph=True, dynamic=False)
    want_loss, want = one_step_gradients(eager, x, target, False)
    loss, got = one_step_gradients(compiled, x, target, False)
    losses = {}
    for name, m in (("eager", eager), ("compiled", compiled)):
        step = training_step(m, x, target, False)
        losses[name] = [float(step()) for _ in range(args.iters)]
    return dict(loss_rel=relative_error(loss, want_loss), grad_rel=relative_error(got, want), losses=losses,
                loss_curve_rel=max(abs(a - b) / abs(b) for a, b in zip(losses["compiled"], losses["eager"])),
                ucudnn=counts(ours))


def exported(args) -> dict:
    device = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False
    _, ours, x, _ = micro_batched_resnet18(args, device)
    ours.eval()
    with torch.no_grad():
        want = ours(x)
    program = torch.export.export(ours, (x,))
    text = str(program.graph)
    with torch.no_grad():
        got = program.module()(x)
    return dict(ucudnn_ops=text.count("ucudnn.convolution"), convolutions=text.count("aten.convolution"),
                output_rel=relative_error(got, want))


def host(args) -> dict:
    """Host us per layer call of a stack of 16 layers, the GPU kept busy by a sleeping kernel
    before each block of steps, so that nothing waits for it."""
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last
    torch.manual_seed(0)
    stack = torch.nn.Sequential(*[torch.nn.Conv2d(256, 256, 3, padding=1, bias=False) for _ in range(16)]).to(
        device, memory_format=fmt)
    x = torch.randn(8, 256, 14, 14, device=device).contiguous(memory_format=fmt).requires_grad_()
    variants = {"torch": stack, "delegated": ut.convert(copy.deepcopy(stack), cache_path=args.cache),
                "planned": ut.convert(copy.deepcopy(stack), delegate=False, cache_path=args.cache)}

    def forward(m):
        with torch.autocast("cuda", dtype=torch.float16):
            return m(x)

    def step(m):
        forward(m).float().sum().backward()
        x.grad = None
        for p in m.parameters():
            p.grad = None

    for m in variants.values():  # observe, plan and settle
        for _ in range(4):
            step(m)
    torch.cuda.synchronize()
    row = {}
    for what, run in (("forward", forward), ("step", step)):
        best = {name: float("inf") for name in variants}
        for _ in range(5):
            for name, m in variants.items():
                torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time ahead of the host
                began = time.perf_counter()
                for _ in range(10):
                    run(m)
                best[name] = min(best[name], (time.perf_counter() - began) / 10 / 16 * 1e6)
                torch.cuda.synchronize()
        row[what] = best
    row["delegated_kernels"] = counts(variants["delegated"])
    row["planned_kernels"] = counts(variants["planned"])
    return row


def ddp(args) -> dict:
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    device, amp = torch.device("cuda", local), True
    torch.backends.cudnn.benchmark = True
    model, x, target = model_of("resnet18", 64, amp, device)
    torch.manual_seed(rank)
    x = torch.randn_like(x)
    ours = ut.convert(copy.deepcopy(model), cache_path=args.cache)

    def plan():
        step = training_step(ours, x, target, amp)
        for _ in range(3):
            step()
        ut.context_of(ours).plan_pending()

    ut.rank_zero_first(plan)
    wrapped = {name: torch.nn.parallel.DistributedDataParallel(m, device_ids=[local])
               for name, m in (("torch", model), ("ucudnn", ours), ("control", copy.deepcopy(model)))}
    steps = {name: training_step(m, x, target, amp) for name, m in wrapped.items()}
    for _ in range(5):
        for step in steps.values():
            step()
    ms = median_iteration_ms(steps, args.rounds, args.iters)
    checksum = torch.stack([sum(p.double().sum() for p in m.parameters()) for m in wrapped.values()])
    gathered = [torch.empty_like(checksum) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, checksum)
    row = dict(rank=rank, ms=ms, ratio=ms["torch"] / ms["ucudnn"], aa=ms["torch"] / ms["control"],
               ranks_agree=all(torch.equal(g, gathered[0]) for g in gathered), ucudnn=counts(ours))
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    dist.destroy_process_group()
    return dict(world=len(rows), ranks=rows)


SECTIONS = {"compile": lambda a: dict(resnet50=compiled_resnet50(a), micro_batched=compiled_micro_batched(a)),
            "export": exported, "host": host, "ddp": ddp}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--sections", default="compile,export,host")
    p.add_argument("--tight", default="8MiB", help="the micro-batched model's limit per kernel")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--cache", default="/tmp/zero-cost.db")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    distributed = "RANK" in os.environ
    path = out / ("zero_cost-ddp.json" if distributed else "zero_cost.json")
    results: dict = {}
    for section in args.sections.split(","):
        began = time.perf_counter()
        try:
            results[section] = SECTIONS[section](args)
        except Exception as exc:  # a section's failure is its result; the others still run
            results[section] = dict(error=f"{type(exc).__name__}: {str(exc)[:400]}", trace=traceback.format_exc()[-1500:])
        results[section]["seconds"] = time.perf_counter() - began
        torch._dynamo.reset()
        if not distributed or int(os.environ["RANK"]) == 0:
            path.write_text(json.dumps(results, indent=1, default=str))
            print(section, json.dumps(results[section], default=str)[:2000], flush=True)


if __name__ == "__main__":
    main()
