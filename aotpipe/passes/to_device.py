"""to_device: the graph rewritten for another device (shared with `aotpipe replay --device`).

Accepts: any graph kind. Factory ops' device arguments and the graph's constants move to
`device`; the example inputs move with them, keeping their aliasing.
"""

from __future__ import annotations

from aotpipe.passes.base import GraphUnderPass, PassResult
from aotpipe.passes.options import ToDeviceOptions
from aotpipe.runtime.devices import move_inputs
from aotpipe.runtime.devices import to_device as rewrite


def to_device(g: GraphUnderPass, options: ToDeviceOptions) -> PassResult:
    g.gm = rewrite(g.gm, options.device)
    g.values = move_inputs(g.values, options.device)
    return PassResult(g, modified=True)  # stats are counts; the device is in the options
