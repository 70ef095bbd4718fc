"""Replay: regenerate inputs, run saved graphs, compare with what capture recorded.

- :mod:`.inputs`: :func:`get_inputs`, random inputs from a `.input` file and inputs.json;
- :mod:`.run`: :func:`replay_graph`, :func:`replay`, :func:`replay_chain`;
- :mod:`.sizes`: :func:`replay_at_sizes`, a shape-polymorphic artefact's graphs at other sizes;
- :mod:`.eager`: the eager model rebuilt from the manifest (for --chain and --bench).
"""

from aotpipe.replay.eager import eager_bench, rebuild_model
from aotpipe.replay.inputs import get_inputs
from aotpipe.replay.run import (
    ChainReplay,
    GraphReplay,
    copy_mutations_back,
    expand_outputs,
    first_divergence,
    replay,
    replay_chain,
    replay_graph,
)
from aotpipe.replay.sizes import SizedReplay, replay_at_sizes
from aotpipe.runtime.devices import move_inputs, to_device
from aotpipe.runtime.execution import run_graph

__all__ = ["ChainReplay", "GraphReplay", "SizedReplay", "copy_mutations_back", "eager_bench", "expand_outputs",
           "first_divergence", "get_inputs", "move_inputs", "rebuild_model", "replay", "replay_chain",
           "replay_at_sizes", "replay_graph", "run_graph", "to_device"]
