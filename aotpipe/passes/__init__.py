"""Graph passes, registered by name in one explicit table.

A pass is a function ``(GraphUnderPass, options) -> PassResult`` in its own module, with a
frozen options dataclass (in passes/options.py). The table names each function by
``module:attribute`` and imports it when it first runs: importing this package, parsing a
pipeline's passes and fingerprinting a model import no torch. In the YAML a pass is named alone (``- freeze``) or with options
(``- freeze: {cse: false}``); every pass takes ``graphs:``, the graph kinds it applies to
(default: inference), each of which it must accept. ``passes: cpu-fast`` names a chain
(:data:`CHAINS`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from aotpipe.format.vocabulary import GRAPH_KINDS, GraphKind
from aotpipe.passes.options import (
    ChannelsLastOptions,
    FoldConvBnOptions,
    FoldScaleOptions,
    FreezeOptions,
    MkldnnFuseOptions,
    ReinplaceOptions,
    RemoveCopiesOptions,
    RemoveNoopsOptions,
    SdpaOptions,
    ToDeviceOptions,
    ViewToReshapeOptions,
)
from aotpipe.spec import PassStep
from aotpipe.spec.registry import by_name, resolve

ALL_KINDS = frozenset(GRAPH_KINDS)
INFERENCE = frozenset({GraphKind.INFERENCE})


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Union[str, Callable[..., Any]]  # the function, or "module:attribute" imported on first use
    options: type
    kinds: frozenset[str]  # graph kinds the pass accepts
    summary: str
    makes_constants: bool = False  # creates or changes constants (the loader reruns such passes)
    needs: tuple[str, ...] = ()  # passes that must come before it in a chain (it does nothing without them)
    # An optimisation: if it fails, a run leaves it out (and the passes that need it) and
    # goes on; a required pass's failure fails the model.
    optional: bool = True

    @property
    def function(self) -> Callable[..., Any]:
        """The pass itself (imports its module, and torch, the first time)."""
        if callable(self.fn):
            return self.fn
        return resolve(self.fn)


# The one registry. Order here is only the order `aotpipe schema` lists them in.
PASSES: dict[str, PassInfo] = by_name([
    PassInfo("freeze", "aotpipe.passes.freeze:freeze", FreezeOptions, INFERENCE,
             "parameters/buffers to constants, then constant folding, CSE, DCE", makes_constants=True),
    PassInfo("fold_conv_bn", "aotpipe.passes.fold_conv_bn:fold_conv_bn", FoldConvBnOptions, INFERENCE,
             "eval batch norm folded into the convolution or linear before it (after freeze)", makes_constants=True, needs=("freeze",)),
    PassInfo("fold_scale", "aotpipe.passes.fold_scale:fold_scale", FoldScaleOptions, INFERENCE,
             "constant scale or shift after a linear, convolution or layer norm folded into its weights (after freeze)",
             makes_constants=True, needs=("freeze",)),
    PassInfo("channels_last", "aotpipe.passes.layout:channels_last", ChannelsLastOptions, INFERENCE,
             "4-d convolution weights channels-last (activations too, with activations: true); outputs keep their "
             "strides (after freeze)", makes_constants=True, needs=("freeze",)),
    PassInfo("sdpa", "aotpipe.passes.attention:sdpa", SdpaOptions, INFERENCE,
             "decomposed attention (matmul, scale, mask, softmax, matmul) as one scaled_dot_product_attention"),
    PassInfo("remove_copies", "aotpipe.passes.copies:remove_copies", RemoveCopiesOptions, INFERENCE,
             "copies a functional graph does not need; max-pool indices nobody reads"),
    PassInfo("mkldnn_fuse", "aotpipe.passes.mkldnn_fuse:mkldnn_fuse", MkldnnFuseOptions, INFERENCE,
             "convolution + bias + relu/gelu/... or residual add as one oneDNN call (CPU only; after freeze)", needs=("freeze",)),
    PassInfo("view_to_reshape", "aotpipe.passes.layout:view_to_reshape", ViewToReshapeOptions, ALL_KINDS, "aten.view -> aten.reshape"),
    PassInfo("remove_noops", "aotpipe.passes.layout:remove_noops", RemoveNoopsOptions, ALL_KINDS, "drop alias, detach and identity views"),
    PassInfo("reinplace", "aotpipe.passes.reinplace:reinplace", ReinplaceOptions, ALL_KINDS,
             "functional ops to in-place where the input is dead and not a graph input"),
    # Required: a graph left on the capture's device is not what the chain was for.
    PassInfo("to_device", "aotpipe.passes.to_device:to_device", ToDeviceOptions, ALL_KINDS, "rewrite for another device",
             makes_constants=True, optional=False),
], "pass")


# Named chains: `passes: cpu-fast` in the YAML stands for this list (recorded expanded).
CHAINS: dict[str, list[Union[str, dict[str, Any]]]] = {
    # What wins on CPU inference (benchmarks/cpu_bench.py): CPU-only graphs (oneDNN ops).
    # remove_copies before any layout change, so capture's strides tell it what a copy does.
    "cpu-fast": ["freeze", "fold_conv_bn", "remove_copies", "sdpa", "fold_scale",
                 {"channels_last": {"activations": True}}, "mkldnn_fuse"],
}


def chain_problem(value: Any) -> Optional[str]:
    """Why `passes:` given as a string is not a named chain, or None."""
    if value in CHAINS:
        return None
    return f"unknown pass chain {value!r}; a chain is a list of passes or one of the named chains: {', '.join(CHAINS)}"


def expand_chain(value: Any) -> list[Union[str, dict[str, Any]]]:
    """`passes:` as a list of entries: a named chain's, or the list itself."""
    return list(CHAINS[value]) if isinstance(value, str) else list(value or [])


def chain_order_problems(names: list[str]) -> list[tuple[int, str]]:
    """(position, message) for each pass of a chain that lacks a pass it needs before it."""
    problems = []
    for i, name in enumerate(names):
        info = PASSES.get(name)
        for need in info.needs if info else ():
            if need not in names[:i]:
                problems.append((i, f"pass {name!r} needs {need!r} before it in the chain: it works on the "
                                    f"constants {need} makes, and without them it would do nothing"))
    return problems


def parse_pass_entry(entry: Any) -> tuple[list[tuple[tuple, str]], PassStep | None]:
    """([(sub-location, message)], step): an entry of `passes:` checked and made typed."""
    if isinstance(entry, str):
        name, raw = entry, {}
        where: tuple = ()
    elif isinstance(entry, dict) and len(entry) == 1:
        ((name, raw),) = entry.items()
        raw = {} if raw is None else raw
        where = (name,)
        if not isinstance(name, str):
            return [((), f"a pass is named by a string, got {name!r}")], None
        if not isinstance(raw, dict):
            return [(where, f"options of pass {name!r} must be a mapping, e.g. {{graphs: [inference]}}")], None
    else:
        return [((), "a pass is a name (- freeze) or a one-key mapping of name to options (- freeze: {cse: false})")], None
    if name not in PASSES:
        return [((), f"unknown pass {name!r}; valid passes: {', '.join(PASSES)}")], None
    info = PASSES[name]
    fields = {f.name: f for f in dataclasses.fields(info.options)}
    problems = []
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            problems.append((where + (key,), f"pass {name!r} has no option {key!r}; its options: {', '.join(fields)}"))
            continue
        default = fields[key].default
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problems.append((where + (key,), f"{key} takes a list of names, e.g. [inference]"))
                continue
            value = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                problems.append((where + (key,), f"{key} takes true or false (got {value!r})"))
                continue
        elif isinstance(default, str) and not isinstance(value, str):
            problems.append((where + (key,), f"{key} takes a string (got {value!r})"))
            continue
        values[key] = value
    step = PassStep(name, info.options(**values)) if not problems else None
    if step is not None:
        for kind in step.graphs:
            if kind not in ALL_KINDS:
                problems.append((where + ("graphs",), f"unknown graph kind {kind!r}; use inference, forward, "
                                 "backward or joint"))
            elif kind not in info.kinds:
                problems.append((where + ("graphs",), f"pass {name!r} cannot take {kind} graphs; it accepts: "
                                 f"{', '.join(sorted(info.kinds))}"))
        if problems:
            step = None
    return problems, step


def options_to_json(options: Any) -> dict[str, Any]:
    """A step's typed options as JSON data (tuples as lists), as the manifest and fingerprint write them."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(options).items()}

