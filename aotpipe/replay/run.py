"""Replay: run a saved graph and compare it with what capture recorded.

- :func:`replay_graph` binds inputs (saved or random), runs the graph, copies mutated
  inputs back, re-expands de-duplicated outputs and compares with the recorded outputs:
  bit for bit (their digests, or their values where stored); on another device, within
  float noise of the same graph replayed on the CPU. On a mismatch it interprets the graph
  node by node and names the first node that departs from the trace recorded at capture.
- :func:`replay_chain` runs forward then backward and checks the gradients against the
  joint graph's and, when the source can be rebuilt, the eager model's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.fx

from aotpipe import accuracy
from aotpipe.artifact.load import Artifact, Expected, GraphArtifact, load
from aotpipe.artifact.records import InputsRecord, OutputRecord, Partition
from aotpipe.devices import move_inputs, parse_device, to_device
from aotpipe.errors import ArtifactError, exception_line
from aotpipe.execution import run_graph, run_with_summaries
from aotpipe.replay.eager import artifact_loss, median_seconds, rebuild_model
from aotpipe.replay.inputs import _flatten_meta, get_inputs


def copy_mutations_back(record: InputsRecord, inputs: list[Any], outputs: list[Any]) -> list[str]:
    """Apply the graph's mutation outputs to the inputs they mutate; returns their targets."""
    by_target = {rec.name: i for i, rec in enumerate(record.inputs)}
    # a parameter or buffer mutation names its target; a user-input mutation its placeholder
    by_target.update({rec.target: i for i, rec in enumerate(record.inputs) if rec.target is not None})
    done = []
    for rec, value in zip(record.outputs, outputs):
        if rec.role == "mutation" and rec.target in by_target and isinstance(value, torch.Tensor):
            target = inputs[by_target[rec.target]]
            if not isinstance(target, torch.Tensor) or target.shape != value.shape:
                raise ArtifactError(f"inputs.json: mutation output of {rec.target!r} does not fit the input it names")
            target.copy_(value)
            done.append(rec.target)
    return done


def expand_outputs(record: InputsRecord, outputs: list[Any]) -> list[Any]:
    """Outputs with every de-duplicated slot filled from the slot it repeats."""
    out = list(outputs)
    for i, rec in enumerate(record.outputs):
        if rec.same_as is not None and i < len(out) and out[i] is None and rec.same_as < len(out):
            out[i] = out[rec.same_as]
    return out


def first_divergence(ga: GraphArtifact, inputs: list[Any], rtol: float = 1e-6) -> Optional[str]:
    """The first node whose value, shape, stride or dtype departs from the capture trace."""
    if not ga.trace or not isinstance(ga.module, torch.fx.GraphModule):
        return None
    recorded = {k: (v.model_dump() if v is not None else None) for k, v in ga.trace.nodes.items()}
    summarise = accuracy.sampled_summary if ga.trace.sampled else accuracy.summary
    _, now = run_with_summaries(ga.module, inputs, summarise)
    for n in ga.module.graph.nodes:
        rec, got = recorded.get(n.name), now.get(n.name)
        if rec is None or got is None:
            continue
        pairs = [(got, rec)] if "items" not in rec else list(zip(got.get("items", []), rec["items"]))
        for a, r in pairs:
            if a is None or r is None:
                continue
            why = accuracy.summary_departs(a, r, rtol)
            if why:
                target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
                return f"{n.name} ({target}): {why}"
    return None


@dataclass
class GraphReplay:
    """The outcome of replaying one graph."""

    kind: str
    status: str  # match (bit-exact) | close (within float noise, on another device) | mismatch | ran | error
    inputs: str  # saved | random
    max_abs_error: Optional[float] = None
    mismatches: list[str] = field(default_factory=list)
    first_divergence: Optional[str] = None
    mutated: list[str] = field(default_factory=list)
    seconds: float = 0.0
    bench_seconds: Optional[float] = None
    eager_bench_seconds: Optional[float] = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status in ("match", "close", "ran")

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if d["max_abs_error"] == float("inf"):
            d["max_abs_error"] = "inf"
        return d


def _label(i: int, rec: OutputRecord) -> str:
    return f"output {i} ({rec.role}{' ' + rec.target if rec.target else ''})"


def compare_recorded(record: InputsRecord, actual: list[Any], expected: list[Expected]) -> tuple[list[str], float]:
    """Problems of `actual` against the recorded outputs (bit for bit), and the worst known error."""
    problems, worst = [], 0.0
    if len(actual) != len(expected):
        return [f"{len(actual)} outputs, recorded {len(expected)}"], float("inf")
    for i, (a, e, rec) in enumerate(zip(actual, expected, record.outputs)):
        if isinstance(a, torch.Tensor) and rec.stride is not None and a.numel() > 1:
            if any(st != rs and sz > 1 for st, rs, sz in zip(a.stride(), rec.stride, a.shape)):
                problems.append(f"output {i}: stride {list(a.stride())} != recorded {rec.stride}")
        if e.has_value:
            if e.spread is not None and isinstance(a, torch.Tensor) and isinstance(e.value, torch.Tensor):
                err = accuracy.max_abs_error(a, e.value)
                if err > 2 * e.spread:  # an op without a deterministic kernel: within its measured spread
                    worst = max(worst, err)
                    problems.append(f"{_label(i, rec)}: max abs error {err:.3g}, over twice the run-to-run "
                                    f"spread {e.spread:.3g} measured at capture")
            elif not accuracy.exact_equal(a, e.value):
                err = accuracy.max_abs_error(a, e.value)
                worst = max(worst, err)
                problems.append(f"{_label(i, rec)}: max abs error {err:.3g}")
        elif e.digest is not None:
            if not isinstance(a, torch.Tensor):
                problems.append(f"{_label(i, rec)}: {type(a).__name__}, recorded a tensor")
                worst = float("inf")
            elif accuracy.digest(a) != e.digest:
                now = accuracy.summary(a)
                detail = f"sum {now['sum']:.8g} (recorded {e.summary['sum']:.8g})" if e.summary and now else ""
                worst = max(worst, abs(now["sum"] - e.summary["sum"]) if e.summary and now else float("inf"))
                problems.append(f"{_label(i, rec)}: not bit-identical to the recorded output; {detail}".rstrip("; "))
    return problems, worst


def replay_graph(
    ga: GraphArtifact,
    *,
    inputs: str = "saved",
    seed: int = 0,
    device: Optional[str] = None,
    bench: int = 0,
) -> GraphReplay:
    """Replay one graph and compare it with its recorded outputs (saved inputs only)."""
    result = GraphReplay(ga.name, "error", inputs)
    try:
        if device is not None:
            dev = parse_device(device)
        if inputs == "saved":
            values = ga.saved_inputs()
        elif inputs == "random":
            flat, _ = _flatten_meta(get_inputs(ga.input_file, seed=seed))
            values = flat
        else:
            raise ArtifactError(f"--inputs must be saved or random, got {inputs!r}")
        cpu_values = list(values)
        module = ga.module
        if device is not None:
            values = move_inputs(values, dev)
            if isinstance(module, torch.fx.GraphModule):
                module = to_device(module, dev)
        t0 = time.perf_counter()
        outs = run_graph(module, values)
        result.seconds = time.perf_counter() - t0
        outs = expand_outputs(ga.record, outs)
        result.mutated = copy_mutations_back(ga.record, values, outs)
        if bench:
            # The graph is functional: rerunning on inputs updated by copy-back is as fast.
            result.bench_seconds = median_seconds(lambda: run_graph(module, values), bench)
        if len(outs) != len(ga.record.outputs):
            result.status = "mismatch"
            result.mismatches = [f"{len(outs)} outputs, recorded {len(ga.record.outputs)}"]
            return result
        on_cpu = device is None or dev.type == "cpu"
        if inputs == "saved" and on_cpu:
            problems, worst = compare_recorded(ga.record, outs, ga.expected_outputs())
            result.max_abs_error = worst
            result.mismatches = problems
            result.status = "mismatch" if problems else "match"
            if problems:
                result.first_divergence = first_divergence(ga, ga.saved_inputs())
        elif inputs == "saved" and dev.type != "meta":
            # Another device runs other kernels: compare with the CPU replay, within float noise.
            cpu = expand_outputs(ga.record, run_graph(ga.module, cpu_values))
            checks = [accuracy.compare(a.cpu() if isinstance(a, torch.Tensor) else a, e, what=_label(i, rec),
                                       rel_floor=1e-4)
                      for i, (a, e, rec) in enumerate(zip(outs, cpu, ga.record.outputs))]
            result.max_abs_error = max((accuracy.max_abs_error(a.cpu(), e) for a, e in zip(outs, cpu)
                                        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)), default=0.0)
            result.mismatches = [c.line() for c in checks if not c.passed]
            result.status = "mismatch" if result.mismatches else "close"
        else:
            # Nothing recorded to compare values with: check the outputs' shapes and dtypes.
            for i, (o, rec) in enumerate(zip(outs, ga.record.outputs)):
                if isinstance(o, torch.Tensor) and (list(o.shape) != rec.shape
                                                    or str(o.dtype).removeprefix("torch.") != rec.dtype):
                    result.mismatches.append(f"output {i}: {o.dtype}{list(o.shape)} != recorded "
                                             f"{rec.dtype}{rec.shape}")
            result.status = "mismatch" if result.mismatches else "ran"
    except ArtifactError:
        raise
    except ValueError as e:
        if device is not None and "is not a device" in str(e):
            raise ArtifactError(f"--device: {e}") from None
        result.error = exception_line(e)
    except Exception as e:
        result.status = "error"
        result.error = f"{exception_line(e)}"
    return result


def replay(
    path: str | Path | Artifact,
    *,
    graphs: Optional[list[str]] = None,
    inputs: str = "saved",
    seed: int = 0,
    device: Optional[str] = None,
    bench: int = 0,
    trust_code: bool = False,
) -> list[GraphReplay]:
    """Replay the graphs of an artefact (all, or those named); see replay_graph."""
    art = path if isinstance(path, Artifact) else load(path, trust_code=trust_code)
    kinds = graphs or list(art.graphs)
    unknown = [k for k in kinds if k not in art.graphs]
    if unknown:
        raise ArtifactError(f"{art.path}: no {', '.join(unknown)} graph; it has {', '.join(art.graphs)}")
    if inputs == "saved" and not all(art.graphs[k].has_saved_values for k in kinds):
        inputs = "random"  # captured with save_inputs: false
    return [replay_graph(art.graphs[k], inputs=inputs, seed=seed, device=device, bench=bench) for k in kinds]


@dataclass
class ChainReplay:
    status: str  # match | mismatch | error (the graphs do not run)
    compared: int
    max_abs_error_vs_joint: float
    max_abs_error_vs_eager: Optional[float]
    eager_within_tolerance: Optional[bool]
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def chain_problems(contract: Partition, fw_out: list[Any], bw_out: list[Any], joint_record: InputsRecord,
                   joint_out: list[Any]) -> tuple[list[str], float, int]:
    """Forward's first outputs then backward's gradients against the joint graph's, bit for bit."""
    joint_grads = {r.target: v for r, v in zip(joint_record.outputs, joint_out) if r.role == "grad"}
    problems, worst, compared = [], 0.0, 0
    for g, target in zip(bw_out, contract.grad_of):
        if target is None:
            continue
        compared += 1
        ref = joint_grads.get(target)
        if not accuracy.exact_equal(g, ref):
            err = accuracy.max_abs_error(g, ref)
            worst = max(worst, err)
            problems.append(f"gradient of {target}: differs from the joint graph's (max abs error {err:.3g})")
    nfo = contract.num_mutated_inputs + contract.num_user_outputs
    for i in range(nfo):
        compared += 1
        if i >= len(fw_out) or i >= len(joint_out):
            problems.append(f"forward output {i}: missing (the partition contract names {nfo} forward outputs)")
        elif not accuracy.exact_equal(fw_out[i], joint_out[i]):
            err = accuracy.max_abs_error(fw_out[i], joint_out[i])
            worst = max(worst, err)
            problems.append(f"forward output {i}: differs from the joint graph's (max abs error {err:.3g})")
    return problems, worst, compared


def chain_key(subgraph: int) -> str:
    """The verification entry of a subgraph's forward-backward-joint chain: "chain", "chain_1", ..."""
    return "chain" if subgraph == 0 else f"chain_{subgraph}"


def replay_chain(path: str | Path | Artifact, *, rebuild_source: bool = True, trust_code: bool = False) -> ChainReplay:
    """Run forward on saved inputs, feed its saved activations to backward, check the gradients.

    Gradients must equal the joint graph's bit for bit, and the rebuilt eager model's under
    the fp64-reference rule of :mod:`aotpipe.accuracy`. Graphs that do not run give status
    "error" with the reason. A dynamo artefact's chain is checked in every subgraph that has
    forward, backward and joint graphs (problems name the subgraph); the eager model's
    gradients are those of the whole model, so they are compared only when it has one subgraph.
    """
    art = path if isinstance(path, Artifact) else load(path)
    chains = {i: keys for i, keys in art.subgraph_keys().items() if {"forward", "backward", "joint"} <= set(keys)}
    if not chains:
        have = art.subgraph_keys().get(0, {})
        missing = next(k for k in ("forward", "backward", "joint") if k not in have)
        raise ArtifactError(f"{art.path}: the chain needs forward, backward and joint graphs; {missing} is missing")
    problems: list[str] = []
    worst, compared = 0.0, 0
    grads0: list[Any] = []
    for i, keys in chains.items():
        fw, bw, joint = art.graphs[keys["forward"]], art.graphs[keys["backward"]], art.graphs[keys["joint"]]
        contract = fw.record.partition
        if contract is None:
            raise ArtifactError(f"{fw.folder}/inputs.json: no partition contract")
        try:
            fw_out = run_graph(fw.module, fw.saved_inputs())
            grads = run_graph(bw.module, bw.saved_inputs(forward_outputs=fw_out))
            joint_out = run_graph(joint.module, joint.saved_inputs())
        except ArtifactError:
            raise
        except Exception as e:  # the artefact's graphs do not run: a result, not a crash
            return ChainReplay("error", 0, float("inf"), None, None,
                               [f"{_subgraph(i, chains)}the graphs do not run: {exception_line(e)}"])
        found, err, n = chain_problems(contract, fw_out, grads, joint.record, joint_out)
        problems += [f"{_subgraph(i, chains)}{p}" for p in found]
        worst, compared = max(worst, err), compared + n
        if i == 0:
            grads0 = grads
    if len(art.subgraph_keys()) > 1 or 0 not in chains:
        return ChainReplay("mismatch" if problems else "match", compared, worst, None, None, problems)
    contract = art.graphs["forward"].record.partition
    assert contract is not None
    try:
        return _chain_vs_eager(art, contract, grads0, problems, worst, compared, rebuild_source, trust_code)
    except ArtifactError:
        raise
    except Exception as e:  # e.g. a rebuilt model that does not take the saved inputs
        problems.append(f"the eager comparison failed: {exception_line(e)}")
        return ChainReplay("mismatch", compared, worst, None, False, problems)


def _subgraph(i: int, chains: dict[int, Any]) -> str:
    """A problem's prefix: which subgraph, when there are several."""
    return f"subgraph {i}: " if len(chains) > 1 or i else ""


def _chain_vs_eager(art: Artifact, contract: Partition, grads: list[Any], problems: list[str], worst: float,
                    compared: int, rebuild_source: bool, trust_code: bool) -> ChainReplay:
    from aotpipe.eager import EagerReference

    eager_err, eager_ok = None, None
    rebuilt = rebuild_model(art, trust_code=trust_code) if rebuild_source else None
    if rebuilt is not None:
        ref = EagerReference(*rebuilt, loss=artifact_loss(art))
        run32 = ref.run("training")
        if run32 is not None:
            eager_err, eager_ok = 0.0, True
            for g, target in zip(grads, contract.grad_of):
                if target is None or target not in run32.grads:
                    continue
                c = accuracy.compare(g, run32.grads[target], lambda t=target: _grad64(ref, t),
                                     what=f"gradient of {target}")
                if isinstance(g, torch.Tensor) and isinstance(run32.grads[target], torch.Tensor):
                    eager_err = max(eager_err, accuracy.max_abs_error(g, run32.grads[target]))
                if not c.passed:
                    eager_ok = False
                    problems.append(f"off the eager model: {c.line()}")
    return ChainReplay("mismatch" if problems else "match", compared, worst, eager_err, eager_ok, problems)


def _grad64(ref: Any, target: str) -> Optional[torch.Tensor]:
    run = ref.run("training", fp64=True)
    return run.grads.get(target) if run is not None else None
