"""Capture a model, write it to a folder and run the checks of a real run on it."""

import torch.utils._pytree as pytree

from aotpipe.artifact.writer import graph_entries, write_model
from aotpipe.capture import capture_export
from aotpipe.capture.binding import bind_inputs
from aotpipe.checks.written import check_written, graph_structure
from aotpipe.models.eager import EagerReference, model_state


def capture_and_check(model, args, kwargs, out_dir, *, graphs=("inference", "forward", "backward", "joint"),
                      names=None, captured=None):
    """(captured graphs, ModelChecks) of `model` written under `out_dir` and checked against eager."""
    names = names if names is not None else [f"arg{i}" for i in range(len(args))]
    cap = captured or capture_export(model, args, kwargs, name="m", graphs=list(graphs), input_names=names)
    user = dict(zip(cap.user_inputs, pytree.tree_leaves((args, kwargs))))
    state = model_state(model, cap.constants)
    inputs = {k: bind_inputs(g, state, user) for k, g in cap.graphs.items() if k != "backward"}
    eager = EagerReference(model, args, kwargs, cap.constants, cap.user_inputs)
    found = []

    def check(folder):
        codes = {key: graph_structure(g.gm) for key, _, _, g, _ in graph_entries(cap)}
        found.append(check_written(folder, memory_inputs=inputs, codes=codes, eager=eager))
        return found[0].outcome

    write_model(out_dir, cap, model_record={"name": "m", "source": "tests"}, fingerprint="0" * 64, inputs=inputs, check=check)
    return cap, found[0]
