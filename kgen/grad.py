"""Kernel calls on tensors that require grad.

kgen kernels compute no gradient.  A plain call would return leaves, and a backward pass
through them would leave the inputs' gradient short without a word; so where autograd
records (grad mode on, an input that requires grad), a ``Kernel`` call's outputs join the
graph through ``NoGradient``, whose backward is a CallError naming the kernel.  Under
``torch.no_grad()`` or ``torch.inference_mode()``, or on inputs that need no grad, calls
go straight to the generated host function.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch.autograd import forward_ad

from .errors import CallError


_Tensor, _grad_enabled = torch.Tensor, torch.is_grad_enabled    # looked up once: this runs at every call
_transforms, _compiling = torch._C._functorch.peek_interpreter_stack, torch.compiler.is_compiling


def needing_grad(label: str, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among a call's arguments (lists of them, and out='s tuple of lists, too)
    that autograd records.  Every kernel call pays for this loop: it stays plain (about 0.1 us
    a tensor).  A call under a torch.func transform, or on a forward-mode dual tensor, is a
    CallError: kgen kernels compute no derivative and read no batched tensor."""
    found: list[torch.Tensor] = []
    # (forward_ad's level is 0 or more inside dual_level(); a private attribute, so -1 without it)
    if not _compiling() and (_transforms() is not None or getattr(forward_ad, "_current_level", -1) >= 0):
        _untransformed(label, args, kwargs)
    if not _grad_enabled():
        return found
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, _Tensor):
            if value.requires_grad:
                found.append(value)
        elif isinstance(value, (list, tuple)):
            found += (t for t in _leaves(value) if t.requires_grad)
    return found


def _untransformed(label: str, args: tuple, kwargs: dict) -> None:
    """A CallError for a call under a torch.func transform, or (inside forward_ad.dual_level(),
    where needing_grad calls this otherwise) one with a forward-mode dual."""
    if _transforms() is not None:
        raise CallError(f"{label}: kgen kernels do not run under torch.func transforms (grad, vmap, jvp, ...): "
                        f"they compute no derivative and take no batched tensors; call the kernel outside the "
                        f"transform")
    for value in (*args, *kwargs.values()):
        for t in _leaves(value) if isinstance(value, (_Tensor, list, tuple)) else ():
            if forward_ad.unpack_dual(t).tangent is not None:
                raise CallError(f"{label}: an input carries a forward-mode tangent (torch.autograd.forward_ad), "
                                f"and kgen kernels compute no derivative; pass its primal, "
                                f"forward_ad.unpack_dual(x).primal")


@torch.compiler.disable   # torch.compile runs these calls as they are: it would trace the backward that raises
def call_recorded(label: str, call: Callable[[], object], needing: list[torch.Tensor], out) -> object:
    """``call()``, its outputs (a tensor, or tuples and lists of them) recorded by autograd as
    computed from ``needing``."""
    if out is not None:   # as torch refuses out= where autograd records
        raise CallError(f"{label}: out= cannot be written where autograd records (a tensor of the call requires grad, "
                        f"and kgen kernels compute no gradient); call under torch.no_grad()")
    shape = []   # the call's result, for its structure

    def run():
        shape.append(call())
        return tuple(_own(t) for t in _leaves(shape[0]))

    flat = NoGradient.apply(label, run, *needing)
    return _rebuild(shape[0], iter(flat))


class NoGradient(torch.autograd.Function):
    """Outputs of a kernel call on inputs that require grad: a backward pass that reaches
    them fails, naming the kernel."""

    @staticmethod
    def forward(ctx, label, run, *needing):
        ctx.label = label
        return run()

    @staticmethod
    def backward(ctx, *grads):
        raise CallError(f"{ctx.label}: a backward pass reached this kernel's outputs, and kgen kernels compute "
                        f"no gradient; call it under torch.no_grad(), or on inputs detached from the graph")


def _leaves(value) -> Iterator[torch.Tensor]:
    """The tensors of a tensor, or of tuples and lists of them (other items skipped)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t``, over its memory, as a tensor of its own where it is a view: a grouped GEMM's
    outputs are carved from one buffer, and autograd refuses in-place changes to outputs of a
    function that returns several views of one base (and the views' shared version counter
    would make a change to one look like a change to every other)."""
    if not t._is_view():
        return t
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.shape,
                                                               t.stride())


def _rebuild(value, flat: Iterator[torch.Tensor]):
    """``value``'s structure (tuples and lists) over the tensors of ``flat``, in order."""
    if isinstance(value, torch.Tensor):
        return next(flat)
    return type(value)(_rebuild(item, flat) for item in value)
