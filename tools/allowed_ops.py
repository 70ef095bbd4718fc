#!/usr/bin/env python3
"""Generate aotpipe/artifact/allowed_ops.txt: the functional ATen ops a loaded graph may call.

The rule (issue 35: derived from torch's operator registry, not grown from what the zoos
happened to emit) admits every ATen operator overload this torch registers whose schema
mutates nothing and that capture can emit:

1. every such op with a kernel of its own (CPU, CUDA, CompositeExplicitAutograd...): export's
   and AOTAutograd's decompositions keep any op they have no decomposition for;
2. not the CompositeImplicitAutograd ones: they decompose while tracing, so no capture emits
   them, and run from a loaded graph they would call the ops they are made of directly, past
   those ops' checked forms (``embedding_bag`` -> ``_embedding_bag``); but those aotpipe's
   own capture and passes name in their source (``linear``, ``lstm.input``...: they emit
   them), export's size nodes (:data:`EXPORT_LEAVES`), and those of core ATen
   (``torch.Tag.core``: ``upsample_bilinear2d.vec``), which export's decomposition keeps;

minus what aotpipe/artifact/ops.py refuses whatever the list says: ops that build sparse,
nested, mkldnn or quantized tensors, resize, touch storages or files, change process-wide
state, are backend- or optimiser-specific or unsafe by contract (``DENIED``); ops with a free
string, Storage or out= argument.

What the rule cannot know is which kernels trust values they are handed (an index, a
length, a size read from a tensor's elements). Those ops are reviewed, not listed by hand:
each runs in a checked form (aotpipe/artifact/checked.py), and the hostile-argument sweep
(tests/artifact/test_hostile_ops.py, slow) calls every admitted op of two or more tensor
arguments with out-of-range values, shapes and strides in guarded memory, so a kernel that
reads past its storage is a failing test, not a silent admission. (Those with no kernel a CPU
call reaches, CUDA's own, it skips by a rule on the dispatcher's table; a CPU kernel that
only raises, by name with its reason.)

Review the diff of the file on a torch upgrade (new ops appear there), then commit it. A
test holds the file equal to what this tool makes.

    .venv/bin/python tools/allowed_ops.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from aotpipe.artifact import ops

def _name(op: torch._ops.OpOverload) -> str:
    return f"{op.namespace}.{op._schema.name.split('::', 1)[1]}.{op._overloadname}"


def rules_admit(name: str) -> bool:
    """Whether ops.py's rules (all but the list itself) admit a functional ATen op."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten" or ops._denied(parts[1], parts[2]):
        return False
    target = ops._lookup(*parts)
    return target is not None and not target._schema.is_mutable and ops._argument_problem(target) is None


def source_ops() -> set[str]:
    """ATen ops named (``aten.linear.default``, ``aten.view``) in aotpipe/passes and aotpipe/capture."""
    import re

    root = Path(ops.__file__).resolve().parents[1]
    found: set[str] = set()
    for folder in ("passes", "capture"):
        for p in sorted((root / folder).rglob("*.py")):
            for op, overload in re.findall(r"aten\.([a-z_0-9]+)(?:\.([A-Za-z_0-9]+))?", p.read_text()):
                found.add(f"aten.{op}.{overload or 'default'}")
    return found - replaced_ops()


def replaced_ops() -> set[str]:
    """Ops capture replaces with a kernel of its own while tracing (capture/ctc.py,
    capture/torch_branches.py): named in its source, never in its graphs."""
    from aotpipe.capture import ctc, torch_branches

    return {str(op) for op in (*ctc.FORMULATED, *torch_branches.KERNELS)}  # str: aten.cov.default


# CompositeImplicitAutograd ops export leaves in a graph: its symbolic sizes, and the reshape
# of its non-strict mode.
EXPORT_LEAVES = frozenset({"aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
                           "aten.sym_storage_offset.default", "aten.sym_is_contiguous.default",
                           "aten.reshape.default"})


def implicit(full: str) -> bool:
    """Whether the op (``aten::name.overload``) is CompositeImplicitAutograd: made of other ops,
    decomposed while tracing."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd")


def generate() -> list[str]:
    """The module's rule, on this torch's registry and aotpipe's source."""
    named = source_ops() | EXPORT_LEAVES
    names: set[str] = set()
    for full in torch._C._dispatch_get_all_op_names():
        ns, _, rest = full.partition("::")
        if ns != "aten":
            continue
        op, _, overload = rest.partition(".")
        target = ops._lookup("aten", op, overload or "default")
        if target is not None and (not implicit(full) or _name(target) in named or torch.Tag.core in target.tags):
            names.add(_name(target))
    return sorted(n for n in names if rules_admit(n))


def main(argv: list[str]) -> int:
    lines = ["# The functional ATen ops a graph loaded from an artefact may call (their in-place variants",
             "# follow). Generated by tools/allowed_ops.py; reviewed: see aotpipe/artifact/ops.py.",
             f"# torch {torch.__version__.split('+')[0]}"]
    lines += generate()
    ops.LIST_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines) - 3} ops -> {ops.LIST_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
