"""Trace any ``torch.nn.Module`` into the simulator's operator graph, without real weights.

How: the module runs one training step (forward, loss, backward) on the ``meta`` device
(shapes and dtypes, no storage) through ``torch.func.functional_call`` with meta copies
of its parameters and buffers, so the caller's module is never touched. A
``TorchDispatchMode`` records every ATen operator with its shapes; views and aliases move
no data and are folded into their producer. Attribution:

* forward ops belong to the innermost module whose forward is running (global module
  hooks); each module call also records the range of autograd sequence numbers its nodes
  received, so a backward op is attributed through the autograd node executing it
  (``torch._C._current_autograd_node``) to the module that created that node;
* ops inside a custom ``torch.autograd.Function`` are tagged with its class name in
  forward (``Function.apply`` is wrapped while tracing) and backward (the node's
  ``_forward_cls``), so they are reported, never silently dropped;
* ``F.scaled_dot_product_attention`` (which decomposes to a math path on meta) is fused
  back into one ATTENTION op per call and per backward;
* gradient readiness (DDP's hook point) comes from
  ``Tensor.register_post_accumulate_grad_hook`` on the meta parameters;
* saved activations come from ``torch.autograd.graph.saved_tensors_hooks``.

torch is imported inside functions only: ``import simulator`` works without it.
A model that cannot be traced raises ``TraceError`` with one line naming the operator or
construct (data-dependent control flow, ``.item()``, a tensor on another device, ...).
"""
from __future__ import annotations

from typing import Any, Callable

from ..errors import UnsupportedError
from ..workload.aten_cost import (
    AtenCost,
    aten_cost,
    dtype_name,
    is_alias,
    is_alloc_only,
    packet_name,
)
from ..workload.traced import BACKWARD, FORWARD, LOSS, TracedGraph
from .trace_state import RawOp, TraceState, finalize


class TraceError(UnsupportedError):
    """The module could not be traced; the message names the operator or construct."""


def import_torch():
    """``import torch`` without its deprecation chatter (e.g. about pynvml) on stderr."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pynvml.*", category=FutureWarning)
        import torch
    return torch


# ---- the recording modes -------------------------------------------------------------------
def _tensor_nbytes(t: Any, cap_by_storage: bool) -> int:
    n = int(t.numel()) * int(t.element_size())
    if cap_by_storage:
        try:
            n = min(n, int(t.untyped_storage().nbytes()))
        except (RuntimeError, NotImplementedError):
            pass
    return n


def _shape_args(torch: Any, args: tuple) -> list:
    return [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]


def _record(st: TraceState, torch: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    from torch.utils._pytree import tree_flatten
    overload = str(func)
    tin = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    tout = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
    if is_alias(overload, bool(getattr(func, "is_view", False))):
        st.alias(tin[:1], tout)
        return
    if is_alloc_only(overload):
        return
    seen: dict[int, Any] = {}
    for t in tin:
        seen.setdefault(id(t), t)
    reads = [(st.producer_of(t), _tensor_nbytes(t, True)) for t in seen.values()]
    out_shapes = [tuple(t.shape) for t in tout]
    cost = aten_cost(overload, [tuple(t.shape) for t in tin], _shape_args(torch, args), out_shapes)
    floats = [t for t in tin if t.is_floating_point()] or tout or tin
    raw = RawOp(overload=overload, phase=st.phase, ctx=st.context(torch),
                in_shapes=tuple(tuple(t.shape) for t in seen.values()),
                out_shapes=tuple(out_shapes), reads=tuple(reads),
                written=sum(_tensor_nbytes(t, False) for t in tout),
                params=tuple(sorted({p for p in (st.param_of(t) for t in seen.values()) if p})),
                cost=cost, dtype=dtype_name(floats[0].dtype) if floats else "fp32")
    st.add(raw, tout)


def _make_dispatch_mode(st: TraceState):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if st.paused:
                return func(*args, **kwargs)
            st.current = str(func)
            out = func(*args, **kwargs)
            _record(st, torch, func, args, kwargs, out)
            return out

    return _Recorder()


def _make_function_mode(st: TraceState):
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    sdpa = F.scaled_dot_product_attention

    class _Fuser(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is not sdpa or not st.fuse_attention or st.paused:
                return func(*args, **kwargs)
            with st.fused_call(torch, "sdpa"):
                return func(*args, **kwargs)

    return _Fuser()


class _PatchedApply:
    """Wraps ``torch.autograd.Function.apply`` to tag ops run inside custom functions."""

    def __init__(self, st: TraceState) -> None:
        self.st = st
        self.saved: Any = None

    def __enter__(self):
        import torch
        fn_cls = torch.autograd.function.Function
        self.saved = fn_cls.__dict__["apply"]
        orig = self.saved.__func__
        st = self.st

        def apply(cls, *args, **kwargs):
            st.custom_stack.append(cls.__name__)
            st.custom_seen.setdefault(cls.__name__, None)
            try:
                return orig(cls, *args, **kwargs)
            finally:
                st.custom_stack.pop()

        fn_cls.apply = classmethod(apply)
        return self

    def __exit__(self, *exc) -> None:
        import torch
        torch.autograd.function.Function.apply = self.saved


# ---- module plumbing -----------------------------------------------------------------------
def _module_hooks(st: TraceState, module: Any):
    import torch
    paths = {id(m): name for name, m in module.named_modules(remove_duplicate=False)}

    def pre(mod, args):
        path = paths.get(id(mod))
        if path is not None:
            st.enter_module(torch, path)

    def post(mod, args, output):
        path = paths.get(id(mod))
        if path is not None:
            st.exit_module(torch, path)

    reg = torch.nn.modules.module
    return [reg.register_module_forward_pre_hook(pre), reg.register_module_forward_hook(post)]


def _to_meta(torch: Any, x: Any) -> Any:
    from torch.utils._pytree import tree_map

    def conv(t):
        if not isinstance(t, torch.Tensor):
            return t
        m = t if t.device.type == "meta" else torch.empty_strided(
            tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
        if t.requires_grad and m is not t:
            m.requires_grad_(True)
        return m
    return tree_map(conv, x)


def _meta_state(torch: Any, module: Any, st: TraceState) -> tuple[dict, dict]:
    """Meta leaf copies of the parameters (with grad-ready hooks) and of the buffers."""
    params, buffers = {}, {}
    for name, p in module.named_parameters():
        m = torch.empty_strided(tuple(p.shape), tuple(p.stride()), dtype=p.dtype, device="meta")
        m.requires_grad_(p.requires_grad)
        if p.requires_grad:
            m.register_post_accumulate_grad_hook(lambda _t, n=name: st.grad_ready(n))
        st.register_param(m, name)
        params[name] = m
    for name, b in module.named_buffers():
        m = torch.empty_strided(tuple(b.shape), tuple(b.stride()), dtype=b.dtype, device="meta")
        st.register_param(m, "", buffer=True)
        buffers[name] = m
    return params, buffers


def _default_loss(torch: Any, out: Any) -> Any:
    from torch.utils._pytree import tree_flatten
    leaves = [t for t in tree_flatten(out)[0]
              if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise TraceError("the model output holds no floating-point tensor that requires grad; "
                         "return one or pass loss_fn")
    loss = leaves[0].sum()
    for t in leaves[1:]:
        loss = loss + t.sum()
    return loss


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def _run_step(torch: Any, st: TraceState, module: Any, args: tuple, kwargs: dict,
              loss_fn: Callable | None) -> None:
    params, buffers = _meta_state(torch, module, st)
    st.register_inputs(args, kwargs)
    hooks = _module_hooks(st, module)
    pack = st.pack_hook(torch)
    try:
        with _PatchedApply(st), _make_function_mode(st), _make_dispatch_mode(st), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
            st.begin(torch)
            out = torch.func.functional_call(module, {**params, **buffers}, args, kwargs)
            st.phase = LOSS
            st.enter_module(torch, "<loss>")
            loss = loss_fn(out) if loss_fn is not None else _default_loss(torch, out)
            st.exit_module(torch, "<loss>")
            st.phase = BACKWARD
            loss.backward()
    finally:
        for h in hooks:
            h.remove()


def _train_mode(module: Any, train: bool) -> dict:
    old = {id(m): m.training for m in module.modules()}
    module.train(train)
    return old


def _restore_mode(module: Any, old: dict) -> None:
    for m in module.modules():
        m.training = old.get(id(m), m.training)


def trace_module(module: Any, example_inputs: Any, *, loss_fn: Callable | None = None,
                 name: str | None = None, fuse_attention: bool = True,
                 train: bool = True) -> TracedGraph:
    """Trace one training step of ``module(*example_inputs)`` into a ``TracedGraph``.

    ``example_inputs``: a tensor, a tuple/list of positional arguments or a dict of
    keyword arguments (real or meta tensors; only shapes and dtypes are used).
    ``loss_fn(output) -> scalar`` defaults to the sum of every floating-point output.
    """
    try:
        torch = import_torch()
    except ImportError as exc:                   # pragma: no cover - torch is optional
        raise TraceError(f"tracing a module needs torch ({exc})") from None
    if not isinstance(module, torch.nn.Module):
        raise TraceError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    st = TraceState(fuse_attention=fuse_attention)
    args, kwargs = _split_inputs(_to_meta(torch, example_inputs))
    old = _train_mode(module, train)
    try:
        _run_step(torch, st, module, args, kwargs, loss_fn)
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure becomes one explained line
        raise TraceError(explain_failure(exc, st, name or type(module).__name__)) from None
    finally:
        _restore_mode(module, old)
    return finalize(st, name or type(module).__name__, module)


# ---- explaining failures -------------------------------------------------------------------
_HINTS = (
    (("_local_scalar_dense", "item() cannot be called", "is_nonzero",
      "data-dependent", "Cannot access data pointer", "cannot be called on meta"),
     "data-dependent value (Tensor.item() / bool() / int() / a Python branch on tensor "
     "values) - meta tracing sees shapes only"),
    (("nonzero", "masked_select", "unique", "repeat_interleave"),
     "data-dependent output shape"),
    (("same device", "meta and cpu", "device type", "Expected all tensors"),
     "a tensor that is neither a parameter, a buffer nor an input (e.g. created on "
     "another device inside forward or kept as a plain attribute); register it as a buffer"),
    (("numpy",), "conversion to NumPy"),
)


def explain_failure(exc: BaseException, st: TraceState, model: str) -> str:
    """One line: what failed, in which module / custom function, and why."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    where = st.where()
    op = st.current
    why = ""
    for needles, hint in _HINTS:
        if any(n.lower() in (text + " " + op).lower() for n in needles):
            why = hint
            break
    op_part = f" at {op}" if op else ""
    reason = f"{why}: " if why else ""
    return (f"cannot trace {model}{op_part} in {where}: {reason}"
            f"{type(exc).__name__}: {text[:200]}")


# ---- factories ("FILE.py:FACTORY") ---------------------------------------------------------
def build_from_factory(factory: Callable[[], Any], on_meta: bool = True) -> tuple[Any, Any, Callable | None, str]:
    """Call ``factory()`` -> ``(module, example_inputs[, loss_fn])``, on the meta device when
    it allows (no weights allocated), otherwise normally; the last item says which."""
    try:
        torch = import_torch()
    except ImportError as exc:                   # pragma: no cover - torch is optional
        raise TraceError(f"tracing a module needs torch ({exc})") from None
    how = "meta"
    res = None
    if on_meta:
        try:
            with torch.device("meta"):
                res = factory()
        except Exception as exc:  # noqa: BLE001 - fall back to a real build
            how = f"cpu (meta build failed: {type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
            res = None
    if res is None:
        how = how if how != "meta" else "cpu"
        try:
            res = factory()
        except Exception as exc:  # noqa: BLE001 - user code; one line
            raise TraceError(f"module: the factory {getattr(factory, '__name__', factory)!s} raised "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(res, (tuple, list)) or len(res) not in (2, 3):
        raise TraceError("module: the factory must return (module, example_inputs) or "
                         f"(module, example_inputs, loss_fn), got {type(res).__name__}")
    loss_fn = res[2] if len(res) == 3 else None
    return res[0], res[1], loss_fn, how


def trace_factory(factory: Callable[[], Any], name: str | None = None,
                  fuse_attention: bool = True) -> TracedGraph:
    module, inputs, loss_fn, how = build_from_factory(factory)
    g = trace_module(module, inputs, loss_fn=loss_fn, name=name, fuse_attention=fuse_attention)
    g.meta["built_on"] = how
    return g


__all__ = ["TraceError", "trace_module", "trace_factory", "build_from_factory",
           "explain_failure", "AtenCost", "packet_name", "FORWARD", "BACKWARD", "LOSS"]
