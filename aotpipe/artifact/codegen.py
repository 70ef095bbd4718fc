"""module.py: a readable, importable Python dump of one graph, with shape annotations.

For people: loading an artefact never imports it (graph.json is the safe way). Importing
it gives a ``GraphModule`` class like ``GraphModule.to_folder`` output; constants, if the
graph has any, are read from the model's blobs by relative path.
"""

from __future__ import annotations

import torch.fx

_HEADER = '''\
# {title}
# Written by aotpipe {version} with torch {torch_version}. Generated code: do not edit.
# Inputs, in order:
{inputs}
import torch
from torch import device  # noqa: F401  (used by factory ops' device arguments)
inf = float("inf")
nan = float("nan")

'''

_CONSTANTS = '''

def _load_constants(module):
    import os
    from safetensors.torch import load_file
    blobs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "blobs")
    import torch
    for target, (digest, shape, stride) in {constants!r}.items():
        value = load_file(os.path.join(blobs, digest + ".safetensors"))["tensor"].reshape(shape)
        module.register_buffer(target, torch.empty_strided(shape, stride, dtype=value.dtype).copy_(value))
'''


def module_source(
    gm: torch.fx.GraphModule,
    *,
    title: str,
    input_lines: list[str],
    constants: dict[str, tuple],
    version: str,
    torch_version: str,
) -> str:
    """The module.py text for `gm` (its stack-trace comments already stripped)."""
    body = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    body = "\n".join(line for line in body.splitlines() if line.strip() != "# No stacktrace found for following nodes")
    if constants:
        body = body.replace(
            "class GraphModule(torch.nn.Module):\n",
            "class GraphModule(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        _load_constants(self)\n\n",
            1,
        )
    text = _HEADER.format(
        title=title,
        version=version,
        torch_version=torch_version,
        inputs="\n".join(f"#   {line}" for line in input_lines) or "#   (none)",
    ) + body.rstrip() + "\n"
    if constants:
        text += _CONSTANTS.format(constants=dict(sorted(constants.items())))
    return text
