"""Example inputs beyond random tensors: nested structures, non-tensor arguments, real data.

- An input's ``name`` may be a path into a nested keyword argument: ``batch.input_ids`` is
  key ``input_ids`` of a dict passed as ``batch``; ``past[0][1]`` is item 1 of item 0 of a
  tuple passed as ``past``.
- ``forward_args:`` gives keyword arguments of forward that are not tensors (flags, scalars,
  strings, lists of them), by name or path.
- An input's ``data:`` loads its tensor from a ``.pt``, ``.safetensors`` or ``.npy`` file
  (relative to the pipeline file) or from a ``module:function`` that returns it; ``key:``
  picks one tensor from a file or a returned mapping that holds several.

A model with nested inputs or forward_args is captured through :class:`StructuredCall`: the
graphs take every tensor input flat and positionally, in the order of ``inputs:``, named by
its path; the structure and the non-tensor values are baked into the graphs as constants
(the manifest's model record keeps both, as written in the YAML).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

from aotpipe.errors import SourceError
from aotpipe.format.records import (
    RawJson,  # a manifest's model record as JSON: it keeps fields no record class declares (forward_args)
)
from aotpipe.spec import DATA_SUFFIXES, is_callable_data, parse_path, path_problem

PathPart = Union[str, int]


def is_structured(spec: Any) -> bool:
    """Whether the spec's model is called through StructuredCall: a nested input name, or forward_args."""
    return bool(getattr(spec, "forward_args", None)) or any(
        inp.name is not None and len(parse_path(inp.name)) > 1 for inp in spec.inputs)


def _insert(root: dict, parts: list[PathPart], value: Any, where: str) -> None:
    node: Any = root
    for here, nxt in zip(parts, parts[1:]):
        child = node.get(here) if isinstance(node, dict) else None
        if child is None:
            child = node[here] = {}
        elif not isinstance(child, dict):
            raise SourceError(f"{where}: {_show(parts)} goes inside {here!r}, which is already a value; "
                              "give each argument one form")
        node = child
    if parts[-1] in node:
        raise SourceError(f"{where}: {_show(parts)} is given twice; give each input path once")
    node[parts[-1]] = value


def _show(parts: list[PathPart]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(parts))


def _containers(node: Any, parts: list[PathPart], where: str) -> Any:
    """Dicts whose keys are all positions become tuples (positions 0..n-1, each present)."""
    if not isinstance(node, dict):
        return node
    keys = list(node)
    ints = [k for k in keys if isinstance(k, int)]
    if ints and len(ints) != len(keys):
        raise SourceError(f"{where}: {_show(parts)} has both named keys and [positions]; use one form")
    if ints:
        if sorted(ints) != list(range(len(ints))):
            missing = sorted(set(range(max(ints) + 1)) - set(ints))
            raise SourceError(f"{where}: {_show(parts)} has no item [{missing[0]}]; give positions 0 to "
                              f"{max(ints)} each once")
        return tuple(_containers(node[k], parts + [k], where) for k in range(len(ints)))
    return {k: _containers(v, parts + [k], where) for k, v in node.items()}


class TensorSlot:
    """Where one flat tensor input goes in the structured call."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<tensor input {self.index}>"


def call_template(spec: Any) -> tuple[int, dict[str, Any]]:
    """(number of positional tensor inputs, keyword arguments with a TensorSlot for each named
    tensor input and forward_args' values in place); a SourceError for a path given twice or
    a tuple with a missing position."""
    where = f"model {spec.name!r}"
    positional = 0
    kwargs: dict[str, Any] = {}
    for i, inp in enumerate(spec.inputs):
        if inp.name is None:
            positional += 1
        else:
            parts = parse_path(inp.name)
            if isinstance(parts[0], int):
                raise SourceError(f"{where}: input {inp.name!r} must start with an argument name")
            _insert(kwargs, parts, TensorSlot(i), where)
    for name, value in (getattr(spec, "forward_args", None) or {}).items():
        problem = path_problem(name)
        if problem is not None:
            raise SourceError(f"{where}: forward_args: {problem}")
        _insert(kwargs, parse_path(name), value, where)
    return positional, {k: _containers(v, [k], where) for k, v in kwargs.items()}


def _fill(node: Any, tensors: tuple) -> Any:
    if isinstance(node, TensorSlot):
        return tensors[node.index]
    if isinstance(node, dict):
        return {k: _fill(v, tensors) for k, v in node.items()}
    if isinstance(node, tuple):
        return tuple(_fill(v, tensors) for v in node)
    if isinstance(node, list):
        return [_fill(v, tensors) for v in node]
    return node


def call_from_record(record: RawJson, tensors: Any) -> tuple[tuple, dict[str, Any]]:
    """The (args, kwargs) the source model takes, rebuilt from a manifest's model record (its
    inputs' names and forward_args) and the user inputs in the order of its `inputs:` (a
    graph's user inputs, saved or from get_inputs): what calls the user's own model again."""
    from types import SimpleNamespace

    spec = SimpleNamespace(name=record.get("name"), forward_args=record.get("forward_args") or {},
                           inputs=[SimpleNamespace(name=i.get("name")) for i in record.get("inputs") or []])
    tensors = tuple(tensors)
    if len(tensors) != len(spec.inputs):
        raise SourceError(f"model {spec.name!r}: {len(tensors)} tensors given for its {len(spec.inputs)} inputs")
    positional, template = call_template(spec)
    return tensors[:positional], _fill(template, tensors)


def structure_note(spec: Any) -> str:
    """The capture note of a structured model: what its graphs take, and what they hold fixed."""
    named = [inp.name for inp in spec.inputs if inp.name is not None]
    fixed = ", ".join(f"{k}={v!r}" for k, v in (getattr(spec, "forward_args", None) or {}).items())
    return ("inputs passed flat, in the order of inputs: (" + ", ".join(named) + "); the call's structure"
            + (f" and its non-tensor arguments ({fixed})" if fixed else "")
            + " are constants of the graphs, which replay does not pass; parameters are named model.<name>")


class StructuredCall(torch.nn.Module):
    """The model called with its nested inputs and non-tensor arguments rebuilt from flat
    tensors: forward takes every tensor input positionally (in the order of ``inputs:``); the
    structure and the constants are fixed here, so the captured graphs hold them."""

    def __init__(self, model: torch.nn.Module, spec: Any) -> None:
        super().__init__()
        self.model = model
        self.positional, self.template = call_template(spec)

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.model(*tensors[:self.positional], **_fill(self.template, tensors))


# ---------------------------------------------------------------------------------------
# device


def device_unavailable(device: Optional[str]) -> Optional[str]:
    """Why capture cannot run on `device` here (no CUDA, or no such GPU); None when it can."""
    if device is None or device == "cpu":
        return None
    if not torch.cuda.is_available():
        return (f"device {device!r}, but torch sees no CUDA GPU here (torch.cuda.is_available() is False); "
                "remove device to capture on the CPU, or run on a machine with a GPU")
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        return (f"device {device!r}, but this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}); pick one of those")
    return None


def on_device(spec: Any, model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[torch.nn.Module, tuple, dict]:
    """The model and its example inputs moved to the spec's `device:` (a SourceError when it is absent)."""
    if spec.device is None or spec.device == "cpu":
        return model, args, kwargs
    missing = device_unavailable(spec.device)
    if missing is not None:
        raise SourceError(f"model {spec.name!r}: {missing}")
    dev = torch.device(spec.device)

    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return t.detach().to(dev).requires_grad_(t.requires_grad)

    return model.to(dev), tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


# ---------------------------------------------------------------------------------------
# real data


def data_code_refusal(record: RawJson, trust_code: bool) -> Optional[str]:
    """Why a manifest's model record may not be rebuilt: an input's data is a function it
    would import and call (code, like a non-builtin source); None otherwise."""
    if trust_code:
        return None
    for inp in record.get("inputs") or []:
        data = inp.get("data") if isinstance(inp, dict) else None
        if isinstance(data, str) and is_callable_data(data):
            return (f"an input's data is the function {data[:80]!r}; rebuilding it would run code the artefact "
                    "names: pass --trust-code (trust_code=True) if you trust this artefact")
    return None


def _loaded(data: str, base_dir: Optional[Path], where: str, resolve: Callable[[str, Optional[Path]], Any]) -> Any:
    if is_callable_data(data):
        try:
            fn = resolve(data, base_dir)  # sources' resolver: a module:function beside the pipeline file
        except SourceError as e:
            raise SourceError(f"{where}.data: {e}") from None
        try:
            return fn()
        except Exception as e:
            raise SourceError(f"{where}.data: calling {data}() raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                              ) from None
    path = Path(data)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.suffix.lower() not in DATA_SUFFIXES:
        raise SourceError(f"{where}.data: {data!r} is neither a .pt, .safetensors nor .npy file nor a module:function; "
                          "use one of those")
    if not path.is_file():
        raise SourceError(f"{where}.data: no such file {str(path)!r}; check the path (relative to the pipeline file)")
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        if path.suffix.lower() == ".npy":
            import numpy as np

            return torch.from_numpy(np.load(str(path), allow_pickle=False))
        # weights_only: a .pt holding anything but tensors and plain containers is refused, never run
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise SourceError(f"{where}.data: cannot read {str(path)!r} ({type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}); "
                          "save tensors with torch.save, safetensors or numpy.save") from None


def load_input_tensor(inp: Any, base_dir: Optional[Path], where: str,
                      resolve: Callable[[str, Optional[Path]], Any]) -> torch.Tensor:
    """The tensor an input's ``data:`` (and ``key:``) gives, checked against its declared
    shape and dtype; a one-line SourceError naming the field and the file otherwise.
    `resolve` imports a ``module:function`` (sources.resolve_callable)."""
    loaded = _loaded(inp.data, base_dir, where, resolve)
    if inp.key is not None:
        if not isinstance(loaded, dict):
            raise SourceError(f"{where}.key: {inp.data!r} holds a {type(loaded).__name__}, not tensors by name; "
                              "remove key")
        if inp.key not in loaded:
            raise SourceError(f"{where}.key: {inp.data!r} has no tensor {inp.key!r}; it has: "
                              f"{', '.join(sorted(map(str, loaded))[:20]) or 'none'}")
        loaded = loaded[inp.key]
    elif isinstance(loaded, dict):
        raise SourceError(f"{where}.key: {inp.data!r} holds {len(loaded)} tensors "
                          f"({', '.join(sorted(map(str, loaded))[:10])}); pick one with key")
    if not isinstance(loaded, torch.Tensor):
        raise SourceError(f"{where}.data: {inp.data!r} gives a {type(loaded).__name__}, not a tensor; "
                          "give a tensor (or tensors by name, with key)")
    dtype = str(loaded.dtype).removeprefix("torch.")
    if dtype != inp.dtype:
        raise SourceError(f"{where}.dtype: {inp.data!r}" + (f" key {inp.key!r}" if inp.key else "")
                          + f" is {dtype}, the input declares {inp.dtype}; set dtype: {dtype} or convert the data")
    if list(loaded.shape) != list(inp.shape):
        raise SourceError(f"{where}.shape: {inp.data!r}" + (f" key {inp.key!r}" if inp.key else "")
                          + f" has shape {list(loaded.shape)}, the input declares {list(inp.shape)}; "
                          f"set shape: {list(loaded.shape)} or reshape the data")
    t = loaded.detach().clone().contiguous()
    return t.requires_grad_(inp.requires_grad)
