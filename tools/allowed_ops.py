#!/usr/bin/env python3
"""Generate aotpipe/artifact/allowed_ops.txt: the functional ATen ops a loaded graph may call.

The list is the union of

1. core ATen (``torch.Tag.core``): what export decomposes every graph to;
2. the ops torch's decomposition tables know (``torch._decomp.decomposition_table``): the
   non-core ops AOTAutograd's functionalised training graphs keep;
3. the ops the loader runs in checked forms (aotpipe/artifact/checked.py);
4. :data:`EXTRAS`, reviewed one by one (why each is there is said beside it);
5. the ATen ops aotpipe's passes and capture name in their source (what they emit);
6. every ATen op in the graph.json files under the folders given (the zoos' runs),

keeping only ops that the rules of aotpipe/artifact/ops.py admit (functional, no free
string or Storage argument, no out=, nothing DENIED). Review the diff of the file before
committing it: an op goes on the list only if its kernel checks every size, index and
length it reads, or it has a checked form.

    .venv/bin/python tools/allowed_ops.py artifacts/quickstart artifacts/zoo-hf
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch._decomp import decomposition_table

from aotpipe.artifact import checked, ops

# Functional ops outside core ATen and the decomposition tables that capture emits.
EXTRAS = {
    "aten._assert_tensor_metadata.default": "export's check of an input's dtype and layout",
    "aten._assert_async.msg": "export's runtime asserts",
    "aten._assert_scalar.default": "export's runtime asserts",
    "aten._functional_assert_async.msg": "export's runtime asserts, functionalised",
    "aten._local_scalar_dense.default": "item(): a data-dependent scalar (the precheck bounds sizes it feeds)",
    "aten._is_all_true.default": "torch._check on a tensor's values (transformers' torch_compilable_check: VITS); "
                                 "a bool tensor reduced to one bool, no size or index read from values",
    "aten.sym_size.int": "a symbolic size",
    "aten.sym_stride.int": "a symbolic stride",
    "aten.sym_numel.default": "a symbolic element count",
    "aten.sym_storage_offset.default": "a symbolic storage offset",
    "aten.reshape.default": "left by export's non-strict mode (a view or a copy; checks its sizes)",
    "aten.histc.default": "a mixture-of-experts router's expert counts (bins bounded by the precheck)",
    "aten.sym_constrain_range.default": "a data-dependent size's range assert (training graphs of routing models)",
    "aten.sym_constrain_range_for_size.default": "a data-dependent size's range assert (training graphs of routing models)",
    "aten.searchsorted.Tensor": "transformers' grouped_mm_fallback, decomposed (MoE); refuses a sorter out of range",
    "aten.searchsorted.Scalar": "as searchsorted.Tensor",
    "aten.empty_permuted.default": "an uninitialised tensor in a given memory order (MoE expert buffers; sizes bounded by the precheck)",
    "aten.put.default": "Tensor.put_ (no deterministic kernel; its CPU kernel refuses indices out of range)",
    # F.pad(mode="replicate") in training graphs (Mimi's and EnCodec's convolutions); the kernel refuses a
    # gradient whose size does not follow from the input's and the padding, and clamps every index it reads
    "aten.replication_pad1d_backward.default": "gradient of replicate padding (checks the gradient's size)",
    "aten.replication_pad2d_backward.default": "as replication_pad1d_backward",
    "aten.replication_pad3d_backward.default": "as replication_pad1d_backward",
    # complex FFT graphs (torch.fft.fft2 / ifft2, and the backward of a complex product)
    "aten._fft_c2c.default": "complex-to-complex FFT; runs in a checked form (dims and normalization, checked.py)",
    "aten._conj.default": "the lazy conjugate of a complex tensor (a view: no size or index it reads)",
    "aten.view_as_real.default": "a complex tensor as pairs of reals (a view; refuses a non-complex input)",
    "aten.view_as_complex.default": "pairs of reals as a complex tensor (a view; refuses a last size other than 2 "
                                    "or a stride other than 1)",
    # stochastic depth / drop path (MobileViT) draws with Tensor.bernoulli_(p)
    "aten.bernoulli.p": "a Bernoulli draw of probability p (its kernel refuses p outside [0, 1])",
    # found by the whole hf-zoo run (each refused at verify before it was reviewed)
    "aten.max.default": "the largest element (a full reduction: reads no size or index; refuses an empty input)",
    "aten.min.default": "as max.default",
    "aten.lift_fresh_copy.default": "a copy of a constant tensor export lifted (reads no size or index)",
    "aten.rand_like.default": "uniform draws shaped like a tensor (no size of its own)",
    "aten.randn_like.default": "normal draws shaped like a tensor (no size of its own; VITS's noise)",
    "aten.randn.generator": "randn with its generator argument (graph.json stores none: the seeded default); "
                            "its literal size is bounded like randn's",
    "aten.grid_sampler_2d_backward.default": "gradient of grid_sample (Mask2Former); runs in a checked form "
                                             "(its modes, checked.py), its kernel checks the shapes",
    "aten.masked_scatter_backward.default": "gradient of masked_scatter: masked_select, zero-padded to a literal "
                                            "size (bounded by the precheck) and viewed; the view refuses a size "
                                            "smaller than the selection",
}


def _name(op: torch._ops.OpOverload) -> str:
    return f"{op.namespace}.{op._schema.name.split('::', 1)[1]}.{op._overloadname}"


def rules_admit(name: str) -> bool:
    """Whether ops.py's rules (all but the list itself) admit a functional ATen op."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten" or ops._denied(parts[1]):
        return False
    target = ops._lookup(*parts)
    return target is not None and not target._schema.is_mutable and ops._argument_problem(target) is None


def graph_ops(folders: list[Path]) -> set[str]:
    found: set[str] = set()
    for folder in folders:
        for p in Path(folder).rglob("graph.json"):
            found |= {n["target"] for n in json.loads(p.read_text())["nodes"] if n.get("op") == "call_function"}
    return {o for o in found if o.startswith("aten.")}


def source_ops() -> set[str]:
    """ATen ops named (``aten.linear.default``, ``aten.view``) in aotpipe/passes and aotpipe/capture."""
    import re

    root = Path(ops.__file__).resolve().parents[1]
    found: set[str] = set()
    for folder in ("passes", "capture"):
        for p in sorted((root / folder).rglob("*.py")):
            for op, overload in re.findall(r"aten\.([a-z_0-9]+)(?:\.([A-Za-z_0-9]+))?", p.read_text()):
                found.add(f"aten.{op}.{overload or 'default'}")
    return found


def generate(folders: list[Path]) -> list[str]:
    names: set[str] = set()
    for full in torch._C._dispatch_get_all_op_names():
        ns, _, rest = full.partition("::")
        if ns != "aten":
            continue
        op, _, overload = rest.partition(".")
        target = ops._lookup("aten", op, overload or "default")
        if target is not None and torch.Tag.core in target.tags:
            names.add(_name(target))
    names |= {_name(k) for k in decomposition_table if isinstance(k, torch._ops.OpOverload) and k.namespace == "aten"}
    names |= {_name(k) for k in checked.CHECKS}
    names |= set(EXTRAS)
    names |= source_ops()
    names |= graph_ops(folders)
    return sorted(n for n in names if rules_admit(n))


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv]
    lines = ["# The functional ATen ops a graph loaded from an artefact may call (their in-place variants",
             "# follow). Generated by tools/allowed_ops.py; reviewed: see aotpipe/artifact/ops.py.",
             f"# torch {torch.__version__.split('+')[0]}"]
    lines += generate(folders)
    ops.LIST_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines) - 3} ops -> {ops.LIST_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
