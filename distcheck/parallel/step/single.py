"""The single-device step in a low precision (torch, imported inside the function): what the ``training-step``
contract holds a parallel step in float32 or bf16 mixed precision to (:mod:`distcheck.parallel.step.precision`).
Rank 0 runs it beside the float64 reference, from the same states
(:func:`~distcheck.parallel.step.harness.run_step`'s ``single``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distcheck.parallel.step.case import StepCase
    from distcheck.parallel.step.hooks import StepTarget

__all__ = ["device_step"]


def device_step(case: StepCase, tokens: Any, labels: Any, starts: list[dict] | None = None,
                target: StepTarget | None = None, initial: dict | None = None) -> list[dict]:
    """The single-device step in the case's precision (``layout.precision``), each step from ``starts`` as
    :func:`~distcheck.parallel.step.harness.reference_step`, recorded as it records (float64 numpy arrays of the
    low-precision values).

    The same micro-batches as the parallel run (dp index d, then micro-batch k: every dp rank's, one after the
    other, gradient accumulation on one device), each backpropagated from ``loss(...) / T`` (the whole step's
    tokens); the parameters, their gradients and AdamW's state in the master dtype. ``bf16-fsdp``: each step's
    forward and backward run on a copy of the master weights cast to bf16 (FSDP2's ``param_dtype``), whose bf16
    gradients are cast to fp32 and added to the master gradients micro-batch by micro-batch (FSDP2's
    ``reduce_dtype=float32`` on one rank); ``bf16-autocast``: the forward and the loss under ``torch.autocast``.
    Then ``clip_grad_norm_`` and ``AdamW.step()``. ``loss`` is the micro-batches' float64 sum of the ``loss``
    hook's values over T (as the ranks report it), ``norm`` and ``scale`` torch's, in the master dtype. Runs on
    CPU with one thread, as every rank does (protocol: ``torch.set_num_threads(1)``), so a micro-batch runs the
    kernels a rank runs (:mod:`distcheck.parallel.step.precision`)."""
    import copy

    import torch

    from distcheck.parallel.step.harness import ADAMW, _load, _record, start_model
    from distcheck.parallel.step.hooks import StepInfo, StepTarget, call_model
    from distcheck.parallel.step.model import IGNORE_INDEX
    from distcheck.parallel.step.precision import autocast_for, get_precision
    from distcheck.parallel.step.reference import StepLayout

    target = target or StepTarget(lambda model, mesh, layout: model)
    prec = get_precision(case.layout.precision)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = start_model(case, target, initial, prec.master, prec.master)
        opt = torch.optim.AdamW(model.parameters(), lr=case.lr, **ADAMW)
        out = []
        for s in range(case.steps):
            if s and starts is not None:
                _load(model, opt, starts[s - 1])
            opt.zero_grad(set_to_none=True)
            total = int((labels[s] != IGNORE_INDEX).sum())
            net = model
            if prec.policy:  # FSDP2's param_dtype: the forward and backward on the master weights cast
                net = copy.deepcopy(model)
                for p in net.parameters():
                    p.data = p.data.to(getattr(torch, prec.compute))
            loss_sum = torch.zeros((), dtype=torch.float64)
            for d in range(case.layout.dp):
                for k in range(case.microbatches):
                    x, y = tokens[s, d, k], labels[s, d, k]
                    info = StepInfo(StepLayout(precision=prec.name), None, total, int((y != IGNORE_INDEX).sum()),
                                    case.microbatches, case.max_norm, k, target.loss)
                    with autocast_for(prec.name, "cpu"):
                        loss = target.loss(call_model(net, target.batch(x, y, info)), y, info)
                    (loss / total).backward()
                    loss_sum += loss.detach().to(torch.float64)
                    if net is not model:  # FSDP2's reduce_dtype: the bf16 gradient cast, then accumulated
                        with torch.no_grad():
                            for p, q in zip(model.parameters(), net.parameters(), strict=True):
                                if q.grad is None:
                                    continue
                                g = q.grad.to(p.dtype)
                                p.grad = g if p.grad is None else p.grad.add_(g)
                        net.zero_grad(set_to_none=True)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), case.max_norm)
            scale = torch.clamp(case.max_norm / (norm + 1e-6), max=1.0)
            opt.step()
            out.append({"loss": float(loss_sum) / total, "tokens": total, "norm": float(norm), "scale": float(scale),
                        **_record(model, opt)})
        return out
    finally:
        torch.set_num_threads(threads)
