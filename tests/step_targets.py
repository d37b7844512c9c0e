"""``training-step`` targets with their own models, for tests/test_step_own_model.py (imported by reference on
every rank, so module-level; torch imported at the top: only the world tests and the ranks import this module).

* ``OWN_LOSS``: a model in Hugging Face's causal-LM shape, ``forward(input_ids, labels=None)`` returning
  ``(loss, logits)`` as a named tuple, ``loss`` the token mean over its micro-batch; the ``batch`` hook passes
  the labels as a keyword, the ``loss`` hook gives distcheck the sum back (``out.loss * microbatch_tokens``),
  FSDP2 over the dp ranks. ``OWN_LOSS_MEAN_OF_MEANS`` backpropagates the model's mean as it is (over the
  micro-batches, times dp for FSDP2's average): the mean of per-micro-batch means.
* ``SHORT``: a user config with a vocabulary of 5 and sequences of at most 4 tokens (only its cases are drawn).
* ``PID_SEEDED``: a factory whose weights depend on the process (a generator seeded by the pid): every rank
  and the reference must still start from one set of weights (rank 0's, broadcast).
"""

from __future__ import annotations

import os
from collections import namedtuple
from dataclasses import dataclass

import torch
from torch import nn

from distcheck.parallel.step import StepTarget, build_model, token_loss_sum

CausalLMOutput = namedtuple("CausalLMOutput", "loss logits")


class LMWithLoss(nn.Module):
    """distcheck's tiny Llama inside a module that computes its own loss when given labels: the mean
    cross-entropy over the non-ignored labels (Hugging Face's ``labels=`` without ``num_items_in_batch``)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.lm = build_model(config)

    def forward(self, input_ids, labels=None):
        logits = self.lm(input_ids)
        if labels is None:
            return CausalLMOutput(None, logits)
        return CausalLMOutput(token_loss_sum(logits, labels) / (labels != -100).sum(), logits)


def fsdp(model, mesh, layout):
    from torch.distributed.fsdp import fully_shard

    return fully_shard(model, mesh=mesh["dp_replicate", "dp_shard"])


def labels_as_keyword(tokens, labels, info):
    return {"input_ids": tokens, "labels": labels}


def mean_times_tokens(output, labels, info):
    return output.loss * info.microbatch_tokens


def mean_of_means(output, labels, info):
    return output.loss * info.layout.dp / info.num_microbatches


_DP = ("dp_replicate", "dp_shard")
OWN_LOSS = StepTarget(fsdp, model=LMWithLoss, batch=labels_as_keyword, loss=mean_times_tokens, axes=_DP)
OWN_LOSS_MEAN_OF_MEANS = StepTarget(fsdp, model=LMWithLoss, batch=labels_as_keyword, loss=mean_times_tokens,
                                    loss_fn=mean_of_means, axes=_DP)


def pid_seeded(config):
    """The tiny Llama with every weight drawn from a generator seeded by this process's id."""
    model = build_model(config)
    gen = torch.Generator().manual_seed(os.getpid())
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / p.shape[-1] ** 0.5)
    return model


PID_SEEDED = StepTarget(fsdp, model=pid_seeded, axes=_DP)


@dataclass(frozen=True)
class ShortConfig:
    vocab_size: int = 5
    block_size: int = 4


SHORT = StepTarget(fsdp, model=LMWithLoss, config=ShortConfig(), axes=_DP + ("tp",))


@dataclass(frozen=True)
class StackConfig:
    vocab_size: int = 8
    dim: int = 6
    n_layers: int = 2


class StackLM(nn.Module):
    """A small plain decoder-shaped model: an embedding, ``n_layers`` residual ``tanh(Linear)`` blocks in a
    ``ModuleDict`` and a head; its forward skips what a pipeline split set to None (torchtitan's convention)."""

    def __init__(self, config: StackConfig) -> None:
        super().__init__()
        self.tok_embeddings: nn.Module | None = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleDict({str(i): nn.Linear(config.dim, config.dim) for i in range(config.n_layers)})
        self.output: nn.Module | None = nn.Linear(config.dim, config.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = h + torch.tanh(layer(h))
        return self.output(h) if self.output is not None else h


def tokens_as_keyword(tokens, labels, info):
    return {"tokens": tokens}


def logits_loss(output, labels, info):
    return token_loss_sum(output, labels)


def stack_split(model, mesh, layout, info, *, scale_grads=False):
    """The ``pipeline`` hook of ``StackLM``: stage i (pp coordinate i) a copy of the whole model with the layers of
    other stages deleted, the embedding off the first stage and the head off the last set to None, in a
    ``PipelineStage`` on the pp group, under the drawn schedule (torch's ``get_schedule_class``)."""
    import copy

    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    stage, pp = mesh["pp"].get_local_rank(), layout.pp
    part = copy.deepcopy(model)
    per = len(part.layers) // pp
    for key in list(part.layers.keys()):
        if int(key) // per != stage:
            del part.layers[key]
    if stage != 0:
        part.tok_embeddings = None
    if stage != pp - 1:
        part.output = None
    pipe = PipelineStage(part, stage, pp, info.device, group=mesh.get_group("pp"))
    schedule = get_schedule_class(info.schedule)(pipe, n_microbatches=info.microbatches, loss_fn=info.loss,
                                                 scale_grads=scale_grads)
    return schedule, [part]


def stack_split_scaled(model, mesh, layout, info):
    """The same split under torch's default ``scale_grads=True``: the schedule divides every gradient by m after
    the step, on top of a loss that already weighs each token ``1/T``."""
    return stack_split(model, mesh, layout, info, scale_grads=True)


def no_parallelize(model, mesh, layout):
    return model


_STACK = {"model": StackLM, "config": StackConfig(), "batch": tokens_as_keyword, "loss": logits_loss,
          "axes": ("pp",)}
#: a plain model under its own pipeline split (GPipe or 1F1B as drawn)
STACK_PP = StepTarget(no_parallelize, pipeline=stack_split, **_STACK)
#: mutant: the schedule also averages the gradients over the m micro-batches (torch's default scale_grads=True)
STACK_PP_SCALED = StepTarget(no_parallelize, pipeline=stack_split_scaled, **_STACK)


class TiedStackLM(StackLM):
    """``StackLM`` with its head tied to the embedding (``output.weight is tok_embeddings.weight``): under a pipeline
    split the first stage holds the embedding's copy, the last the head's."""

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config)
        self.output.weight = self.tok_embeddings.weight


def sum_tied_copies(model, info):
    """``finalize_grads``: Megatron-LM's embedding all-reduce, the two copies' gradients summed over the pp group."""
    import torch.distributed as dist

    copy = model.tok_embeddings if model.tok_embeddings is not None else model.output
    dist.all_reduce(copy.weight.grad, group=info.mesh.get_group("pp"))


def count_tied_once(parameters, max_norm, info):
    """``clip_grad_norm``: the last stage's copy clipped but not counted (the first stage counts it)."""
    from distcheck.parallel.step.hooks import torch_clip

    model = info.model
    return torch_clip(parameters, max_norm, info, shared=[model.output.weight] if model.tok_embeddings is None else [])


_TIED = dict(_STACK, model=TiedStackLM, clip_grad_norm=count_tied_once)
#: a tied head under its own split, the copies' gradients summed: each copy is the reference's one weight
STACK_PP_TIED = StepTarget(no_parallelize, pipeline=stack_split, finalize_grads=sum_tied_copies, **_TIED)
#: mutant: the copies' gradients never summed (each stage steps its copy with half the gradient)
STACK_PP_TIED_UNSUMMED = StepTarget(no_parallelize, pipeline=stack_split, **_TIED)
