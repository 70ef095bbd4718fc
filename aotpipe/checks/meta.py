"""Checks of a just-written artefact of capture mode meta: shapes, strides and dtypes, no values."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module

from aotpipe.format import limits
from aotpipe.artifact.graph_json import decode_dtype
from aotpipe.artifact.load import build_inputs, load
from aotpipe.format.records import VerificationEntry
from aotpipe.artifact.writer import CheckOutcome, GraphOutcome, OutputReference
from aotpipe.capture.meta import fake_like
from aotpipe.format.ir import TensorMeta
from aotpipe.checks.checked import CheckedGraph
from aotpipe.checks.written import ModelChecks, graph_did_not_run, graph_structure
from aotpipe.replay.run import expand_outputs


def check_meta_written(folder: Path, *, codes: Optional[dict[str, list[str]]] = None,
                       trust_ops: Sequence[str] = (), own_capture: bool = False) -> Any:
    """The post-write check of a meta artefact (write_model's `check`): a ModelChecks.

    Each graph is loaded back through the safe loader, must rebuild the captured graph
    exactly (`codes`: each graph's graph_structure at capture), and is run once on fake
    inputs made from its inputs.json (recorded shapes, strides, dtypes, devices, aliasing;
    no memory): every output must have the recorded shape, stride and dtype. There are no
    values, so no comparison with eager: the checks are counted as skipped with that reason,
    and each graph's status is "shapes only".
    """
    start = time.perf_counter()
    # Byte limits guard allocations; this check makes none (fake tensors), so a 70B-size
    # graph's literal sizes (an lm_head gradient of 4 GB) must not stop it. Node counts and
    # record sizes stay limited.
    # Modules built lazily and run node by node: each graph runs once, and making and
    # compiling the Python code of a 70B-size joint graph costs more than interpreting it.
    with limits.unbounded_bytes(), _use_lazy_graph_module(True):
        art = load(folder, trust_ops=trust_ops, own_capture=own_capture).build_all()
    result = ModelChecks(CheckOutcome())
    mode = FakeTensorMode(allow_non_fake_inputs=False)  # one for all graphs: making one costs ~1 s
    for key, ga in art.graphs.items():
        gm = ga.module
        if codes and key in codes and graph_structure(gm) != codes[key]:
            result.problems.append(f"{key} graph: graph.json does not rebuild the captured graph exactly")
        try:
            bases = [fake_like(mode, torch.empty((s.numel,), dtype=decode_dtype(s.dtype), device="meta"),
                           torch.device(s.device)) for s in ga.record.storages]
            inputs = build_inputs(ga.record.inputs, bases, random=True)
            fn = torch.fx.Interpreter(gm).run if isinstance(gm, torch.fx.GraphModule) else gm
            with mode, torch.no_grad():
                outs = expand_outputs(ga.record, list(fn(*inputs)))
        except Exception as e:
            graph_did_not_run(result, key, ga, "the written graph does not run on fake inputs", e)
            continue
        gc = CheckedGraph(skipped=["mode meta: no values to compare"] * len(ga.record.outputs))
        layouts = []
        for i, (o, rec) in enumerate(zip(outs, ga.record.outputs)):
            if not isinstance(o, torch.Tensor) or rec.same_as is not None:
                layouts.append(OutputReference())
                continue
            got = TensorMeta.of(o)
            if rec.shape is not None and (list(got.shape) != rec.shape or list(got.stride) != rec.stride
                                          or str(got.dtype).removeprefix("torch.") != rec.dtype):
                result.problems.append(f"{key} graph: output {i} is {got.dtype}{list(got.shape)} stride "
                                       f"{list(got.stride)}, recorded {rec.dtype}{rec.shape} stride {rec.stride}")
            layouts.append(OutputReference(layout=got.layout()))
        result.graphs[key] = gc
        result.outcome.graphs[key] = GraphOutcome(
            layouts, None, None, gc.record(), [],
            VerificationEntry(status="shapes only", inputs="fake (mode meta: no values)"))
    return result.finish(start)
