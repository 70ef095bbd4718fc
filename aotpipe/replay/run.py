"""Replay: run a saved graph and compare it with what capture recorded.

- :func:`replay` runs an artefact's graphs at the intra-op thread count its outputs were
  recorded at (manifest.environment) unless told another;
- :func:`replay_graph` binds inputs (saved or random), runs the graph, copies mutated
  inputs back, re-expands de-duplicated outputs and compares with the recorded outputs:
  bit for bit (their digests, or their values where stored) in the recorded environment;
  where the CPU (model, features or capability), torch, thread count or device differ, or
  the artefact does not say which CPU it was made on, by each output's evidence
  (aotpipe.runtime.evidence: "close" within its element-wise bound). Every error it reports is
  element-wise. On a mismatch it interprets the graph node by node and names the first
  node that departs from the trace recorded at capture.
- :func:`replay_chain` runs forward then backward and checks the gradients against the
  joint graph's and, when the source can be rebuilt, the eager model's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.fx

from aotpipe.artifact.load import Artifact, Expected, GraphArtifact, load
from aotpipe.artifact.precheck import data_dependent_outputs
from aotpipe.errors import ArtifactError, exception_line
from aotpipe.format.records import InputsRecord, OutputRecord, Partition, Summary, TupleSummary
from aotpipe.format.vocabulary import TRAINING_KINDS
from aotpipe.models.eager import EagerReference
from aotpipe.replay.eager import artifact_loss, median_seconds, rebuild_model
from aotpipe.replay.inputs import _flatten_meta, get_inputs
from aotpipe.runtime import accuracy, evidence
from aotpipe.runtime.determinism import environment as current_environment
from aotpipe.runtime.determinism import environment_differences, intra_op_threads, unrecorded_cpu
from aotpipe.runtime.devices import move_inputs, parse_device, to_device
from aotpipe.runtime.execution import run_graph, run_with_summaries


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


# How far a node's sampled sums may depart from the trace before it counts as diverging: on
# the machine that recorded it (bits must match; a little slack for ops without a
# deterministic kernel), and elsewhere (float noise from other orders of summation).
SAME_RTOL = 1e-6
ELSEWHERE_RTOL = 1e-4


def first_divergence(ga: GraphArtifact, inputs: list[Any], rtol: float = SAME_RTOL) -> Optional[str]:
    """The first node whose value, shape, stride or dtype departs from the capture trace (the
    sums of the same sampled elements, more than `rtol` of their absolute sum apart)."""
    if not ga.trace or not isinstance(ga.module, torch.fx.GraphModule):
        return None
    summarise = accuracy.sampled_summary if ga.trace.sampled else accuracy.summary
    _, now = run_with_summaries(ga.module, inputs, summarise)
    for n in ga.module.graph.nodes:
        rec, got = ga.trace.nodes.get(n.name), now.get(n.name)
        if rec is None or got is None:
            continue
        # A tuple's elements pair up with the recorded TupleSummary's (a node that is no longer a
        # tuple pairs with none); a tensor's summary with the recorded Summary.
        pairs = list(zip(got if isinstance(got, tuple) else (), rec.items)) if isinstance(rec, TupleSummary) \
            else [(got, rec)] if isinstance(got, Summary) else []
        for a, r in pairs:
            if a is None or r is None:
                continue
            why = _departs(a, r, rtol)
            if why:
                target = "graph input" if n.op == "placeholder" else n.target if isinstance(n.target, str) \
                    else getattr(n.target, "__name__", str(n.target))
                return f"{n.name} ({target}): {why}"
    return None


def _departs(now: Summary, recorded: Summary, rtol: float) -> Optional[str]:
    """How a node's summary departs from the recorded one: layout, or the sums of its sampled
    elements (the same elements in both) more than `rtol` of their absolute sum apart."""
    why = accuracy.summary_departs(now, recorded, rtol)
    if why is None or why.split()[0] not in ("sum", "abs_sum"):
        return why
    key = why.split()[0]
    what = "sum" if key == "sum" else "absolute sum"
    return f"{what} of its sampled elements {getattr(now, key):.9g}, recorded {getattr(recorded, key):.9g}"


@dataclass
class OutputError:
    """An output's element-wise difference from what was recorded, over `elements` of its
    `numel` elements (all of them where the value was stored, else the evidence's sample)."""

    output: str
    max_abs_error: float
    elements: int
    numel: int
    bound: Optional[float] = None  # where judged by evidence: the largest error that passes

    def line(self) -> str:
        over = f"all {self.numel} elements" if self.elements == self.numel else \
            f"{self.elements} sampled elements of {self.numel}"
        bound = "" if self.bound is None else f", bound {self.bound:.3g}"
        return f"{self.output}: max abs error {self.max_abs_error:.3g} over {over}{bound}"


@dataclass
class GraphReplay:
    """The outcome of replaying one graph."""

    kind: str
    # match: bit for bit, where it was made. close: where bits cannot match (`environment`
    # says why), every output within its evidence's bound. unverified: bits differ and the
    # artefact records too little to judge them (format 2 from a machine it does not name:
    # only sums of sampled elements, which can refute closeness, not prove it); not ok.
    # mismatch | ran (nothing to compare with: random inputs) | error.
    status: str
    inputs: str  # saved | random | drawn (at other sizes: from the model spec, replay/sizes.py)
    max_abs_error: Optional[float] = None  # element-wise, the largest of `errors`
    mismatches: list[str] = field(default_factory=list)
    first_divergence: Optional[str] = None
    mutated: list[str] = field(default_factory=list)
    seconds: float = 0.0
    bench_seconds: Optional[float] = None
    eager_bench_seconds: Optional[float] = None
    error: Optional[str] = None
    environment: list[str] = field(default_factory=list)  # why bits cannot match here; empty: they must
    errors: list[OutputError] = field(default_factory=list)  # per output that differs: element-wise figures
    bit_identical: Optional[bool] = None  # every output's digest matched
    shapes: list[list[int] | None] = field(default_factory=list)  # at other sizes: each output's (None: no tensor)

    @property
    def ok(self) -> bool:
        return self.status in ("match", "close", "ran")

    @property
    def verdict(self) -> str:
        """The status as people read it: "close (2 threads, recorded 1)"."""
        return f"{self.status} ({'; '.join(self.environment)})" if self.environment and \
            self.status in ("close", "mismatch", "unverified") else self.status

    def worst(self) -> Optional[OutputError]:
        """The output nearest its bound (or with the largest error, where there is no bound)."""
        def key(e: OutputError) -> float:
            if e.bound is None:
                return e.max_abs_error
            return e.max_abs_error / e.bound if e.bound else (0.0 if e.max_abs_error == 0 else math.inf)
        return max(self.errors, key=key, default=None)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["errors"] = [_finite(dict(e.__dict__)) for e in self.errors]
        return _finite(d)


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    for k in ("max_abs_error", "bound"):
        if isinstance(d.get(k), float) and math.isinf(d[k]):
            d[k] = "inf"
    return d


def _label(i: int, rec: OutputRecord) -> str:
    return f"output {i} ({rec.role}{' ' + rec.target if rec.target else ''})"


def _scalar(x: Any) -> bool:
    """A Python int, float or bool: a size or flag a graph computed (never a tensor)."""
    return isinstance(x, (bool, int, float))


def _numel(rec: OutputRecord, a: Any) -> int:
    if rec.shape is not None:
        return math.prod(rec.shape)
    return a.numel() if isinstance(a, torch.Tensor) else 1


# Why an output whose bits differ is judged by its sampled sums alone (compare_recorded).
_FORMAT_2 = "all format version 2 records of it: replay it on the machine that made it, or capture it again"


def compare_recorded(ga: GraphArtifact, actual: list[Any], expected: list[Expected],
                     elsewhere: bool = False, unjudged: list[str] | None = None,
                     outputs: list[OutputRecord] | None = None,
                     records_only: str = _FORMAT_2) -> tuple[list[str], list[OutputError], bool]:
    """(problems, element-wise errors of the outputs that differ, whether every digest matched)
    of `actual` against the recorded outputs. Outputs whose bits differ and that the artefact
    records too little to judge (format 2 elsewhere, sums not refuting) go to `unjudged`.
    `outputs`: the output records with their layouts where `actual` was run (other sizes:
    replay_at_sizes); by default inputs.json's. `records_only`: why sums are all there is to
    judge an output by, and what to do (an unjudged output's line ends with it).

    Where it was made (`elsewhere` false), bit for bit: a digest that differs is a problem,
    and its error is measured over the evidence's sampled elements (format version 3) or,
    where the value was stored, over all of them. Elsewhere, each output that differs is
    judged by its evidence (aotpipe.runtime.evidence): within its element-wise bound it is close."""
    record = ga.record
    problems: list[str] = []
    errors: list[OutputError] = []
    identical = True
    if len(actual) != len(expected):
        return [f"{len(actual)} outputs, recorded {len(expected)}"], [], False
    for i, (a, e, rec) in enumerate(zip(actual, expected, outputs if outputs is not None else record.outputs)):
        what = _label(i, rec)
        if isinstance(a, torch.Tensor) and rec.stride is not None and a.numel() > 1:
            if any(st != rs and sz > 1 for st, rs, sz in zip(a.stride(), rec.stride, a.shape)):
                problems.append(f"output {i}: stride {list(a.stride())} != recorded {rec.stride}")
        if e.has_value and (_scalar(a) or _scalar(e.value)):
            if type(a) is type(e.value) and accuracy.exact_equal(a, e.value):
                continue
            if e.value is None and record.format_version < 3:
                continue  # versions 1 and 2 record no value for an int, float or bool output
            identical = False
            problems.append(f"{what}: {a!r}, recorded {e.value!r}; {type(a).__name__} outputs must be equal, "
                            "here and elsewhere")
            continue
        if e.has_value:
            if accuracy.exact_equal(a, e.value):
                continue
            identical = False
            if not (isinstance(a, torch.Tensor) and isinstance(e.value, torch.Tensor)):
                problems.append(f"{what}: {a!r}, recorded {e.value!r}")
                continue
            err = accuracy.max_abs_error(a, e.value)
            if e.spread is not None and not elsewhere:
                bound = 2 * e.spread  # an op without a deterministic kernel: within its measured spread
                errors.append(OutputError(what, err, a.numel(), a.numel(), bound))
                if err > bound:
                    problems.append(f"{what}: max abs error {err:.3g}, over twice the run-to-run "
                                    f"spread {e.spread:.3g} measured at capture")
            elif elsewhere and a.shape == e.value.shape and a.dtype == e.value.dtype:
                ev = e.evidence
                bound = ev.bound if ev is not None else evidence.bound(e.value, None)[0]
                bound = max(bound or 0.0, 2 * (e.spread or 0.0))
                errors.append(OutputError(what, err, a.numel(), a.numel(), bound))
                if err > bound:
                    problems.append(f"{what}: max abs error {err:.3g} over all {a.numel()} elements, "
                                    f"over the bound {bound:.3g}")
            else:
                errors.append(OutputError(what, err, a.numel(), a.numel()))
                problems.append(f"{what}: not bit-identical to the recorded output; max abs error {err:.3g} "
                                f"over all {a.numel()} elements")
        elif e.digest is not None:
            if not isinstance(a, torch.Tensor):
                problems.append(f"{what}: {type(a).__name__}, recorded a tensor")
                identical = False
                continue
            if accuracy.digest(a) == e.digest:
                continue
            identical = False
            if e.evidence is not None:
                j = evidence.judge(a, e.evidence, ga.blobs.get(e.evidence.blob), _numel(rec, a))
                if j.max_abs_error is not None:
                    errors.append(OutputError(what, j.max_abs_error, j.count, _numel(rec, a),
                                              j.bound if elsewhere else None))
                if not elsewhere:
                    figure = (f"; max abs error {j.max_abs_error:.3g} over {j.count} sampled elements of "
                              f"{_numel(rec, a)}" if j.max_abs_error is not None else f"; {j.detail}")
                    problems.append(f"{what}: not bit-identical to the recorded output{figure}")
                elif not j.passed:
                    problems.append(f"{what}: {j.detail}")
            elif elsewhere and e.summary is not None:
                why = _sums_beyond_noise(a, e.summary)
                if why:
                    problems.append(f"{what}: {why}")
                elif unjudged is not None:
                    unjudged.append(f"{what}: not bit-identical; its sampled sums are within float noise of the "
                                    f"recorded ones, {records_only}")
                else:
                    problems.append(f"{what}: not bit-identical, and the artefact records too little to judge it")
            elif elsewhere:
                problems.append(f"{what}: not bit-identical, and the artefact records no evidence to judge it "
                                "by elsewhere (format version < 3): replay it where it was made")
            else:
                problems.append(f"{what}: not bit-identical to the recorded output{_sampled_sums(a, e)}")
    return problems, errors, identical


def _sums_beyond_noise(a: torch.Tensor, recorded: Summary) -> Optional[str]:
    """Why `a` cannot be the recorded output give or take float noise, judged by the sums of
    its sampled elements (format version 2 records no element-wise evidence), or None.

    Each sampled element may differ by the element-wise bound of `a`'s float-noise floor
    (evidence.bound without eager's error); sums further apart than the sample's count times
    that bound mean some element is off by more. A weaker test than evidence's element by
    element one: it can refute, not prove, closeness."""
    if not (a.is_floating_point() or a.is_complex()):
        return "not bit-identical; integer and bool outputs must be equal, here and elsewhere"
    sample = accuracy.sampled(a)
    now = accuracy.sampled_summary(a)
    if sample is None or now is None:
        return None
    departs = accuracy.summary_departs(now, recorded, 0.0)
    if departs is None or not departs.startswith(("sum", "abs_sum")):
        return f"not bit-identical; over the same sampled elements: {departs}" if departs else None
    bound = evidence.bound(a, None)[0] or 0.0
    slack = sample.numel() * bound
    for key in ("sum", "abs_sum"):
        diff = abs(getattr(now, key) - getattr(recorded, key))
        if diff > slack:
            return (f"not bit-identical; over the same {sample.numel()} sampled elements, {key} "
                    f"{getattr(now, key)!r} != recorded {getattr(recorded, key)!r}, {diff:.3g} apart, over "
                    f"{sample.numel()} times the element-wise bound {bound:.3g}")
    return None


def _sampled_sums(a: torch.Tensor, e: Expected) -> str:
    """The recorded summary (version 2) beside the same summary of `a`: sums of the same
    sampled elements, never a whole tensor's sum beside a sample's."""
    if not e.summary:
        return ""
    now = accuracy.sampled_summary(a)
    if now is None:
        return ""
    why = accuracy.summary_departs(now, e.summary, 0.0)
    return f"; over the same sampled elements: {why}" if why else ""


def replay_graph(
    ga: GraphArtifact,
    *,
    inputs: str = "saved",
    seed: int = 0,
    device: Optional[str] = None,
    bench: int = 0,
    environment: Optional[list[str]] = None,
    unrecorded: Optional[str] = None,
) -> GraphReplay:
    """Replay one graph and compare it with its recorded outputs (saved inputs only).

    `environment`: why bits cannot match here (determinism.environment_differences; replay()
    works it out from the manifest). Empty or None: the outputs must match their digests bit
    for bit. Otherwise they are judged by their evidence: "close" within its bounds.
    `unrecorded`: why it cannot be told whether they must (determinism.unrecorded_cpu: the
    artefact does not say which CPU it was made on). Then outputs that match bit for bit
    are a "match", and any that differ are judged by their evidence, the reason said; where
    there is none to judge by (format 2), "unverified"."""
    result = GraphReplay(ga.name, "error", inputs, environment=list(environment or []))
    try:
        if device is not None:
            dev = parse_device(device)
        if inputs == "saved":
            values = ga.saved_inputs()
        elif inputs == "random":
            # A backward's data-dependent sizes and saved indices: from the forward's recorded
            # outputs (version 3), which the saved tensors' recorded shapes agree with.
            forward = ga.upstream.record if ga.upstream is not None else None
            flat, _ = _flatten_meta(get_inputs(ga.input_file, seed=seed, forward=forward))
            values = flat
        else:
            raise ArtifactError(f"--inputs must be saved or random, got {inputs!r}")
        cpu_values = list(values)
        outs, values, module = run_on_device(ga, values, device, result)
        result.mutated = copy_mutations_back(ga.record, values, outs)
        if bench:
            # The graph is functional: rerunning on inputs updated by copy-back is as fast.
            result.bench_seconds = median_seconds(lambda: run_graph(module, values), bench)
        if len(outs) != len(ga.record.outputs):
            result.status = "mismatch"
            result.mismatches = [f"{len(outs)} outputs, recorded {len(ga.record.outputs)}"]
            return result
        on_cpu = device is None or dev.type == "cpu"
        expected = ga.expected_outputs() if inputs == "saved" else []
        by_evidence = all(e.evidence is not None or e.has_value or e.digest is None for e in expected)
        if inputs == "saved" and (on_cpu or (dev.type != "meta" and by_evidence)):
            elsewhere = bool(result.environment) or unrecorded is not None
            unjudged: list[str] = []
            problems, errors, identical = compare_recorded(ga, [_cpu(o) for o in outs], expected, elsewhere,
                                                           unjudged)
            result.errors, result.bit_identical = errors, identical
            result.max_abs_error = max((e.max_abs_error for e in errors), default=0.0 if identical else None)
            result.mismatches = problems or unjudged
            if unrecorded is not None and not identical:
                result.environment.append(unrecorded)  # why a bit difference is judged, not refused
            result.status = "mismatch" if problems else "unverified" if unjudged else \
                ("close" if result.environment else "match")
            if problems:
                result.first_divergence = first_divergence(ga, ga.saved_inputs(),
                                                           ELSEWHERE_RTOL if elsewhere else SAME_RTOL)
        elif inputs == "saved" and dev.type != "meta":
            # No evidence recorded (format version < 3): compare with the CPU replay, within float noise.
            cpu = expand_outputs(ga.record, run_graph(ga.module, cpu_values))
            checks = [accuracy.compare(_cpu(a), e, what=_label(i, rec), rel_floor=1e-4)
                      for i, (a, e, rec) in enumerate(zip(outs, cpu, ga.record.outputs))]
            result.errors = [OutputError(_label(i, rec), accuracy.max_abs_error(a.cpu(), e), a.numel(), a.numel())
                             for i, (a, e, rec) in enumerate(zip(outs, cpu, ga.record.outputs))
                             if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)]
            result.max_abs_error = max((e.max_abs_error for e in result.errors), default=0.0)
            result.mismatches = [c.line() for c in checks if not c.passed]
            result.status = "mismatch" if result.mismatches else "close"
        else:
            # Nothing recorded to compare values with: check the outputs' shapes and dtypes.
            result.mismatches = layout_mismatches(ga, outs)
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


def layout_mismatches(ga: GraphArtifact, outs: list[Any], outputs: list[OutputRecord] | None = None) -> list[str]:
    """Each output whose shape or dtype is not the recorded one (`outputs`: the records at the
    sizes it ran at; by default inputs.json's), except the sizes that depend on tensor values
    (other inputs give other sizes)."""
    varies = data_dependent_outputs(ga.module)
    out = []
    for i, (o, rec) in enumerate(zip(outs, outputs if outputs is not None else ga.record.outputs)):
        if isinstance(o, torch.Tensor) and (not _same_shape(o, rec.shape, varies.get(i, []))
                                            or str(o.dtype).removeprefix("torch.") != rec.dtype):
            out.append(f"output {i}: {o.dtype}{list(o.shape)} != recorded {rec.dtype}{rec.shape}")
    return out


def run_on_device(ga: GraphArtifact, values: list[Any], device: str | None, result: GraphReplay
                  ) -> tuple[list[Any], list[Any], torch.nn.Module]:
    """(outputs, de-duplicated ones re-expanded; the inputs and the graph as run) of `ga` on
    `values`, moved with its graph to `device` if given; the seconds it ran into `result`."""
    module = ga.module
    if device is not None:
        dev = parse_device(device)
        values = move_inputs(values, dev)
        if isinstance(module, torch.fx.GraphModule):
            module = to_device(module, dev)
    t0 = time.perf_counter()
    outs = run_graph(module, values)
    result.seconds = time.perf_counter() - t0
    return expand_outputs(ga.record, outs), values, module


def _same_shape(o: torch.Tensor, recorded: Optional[list[int]], free: list[int]) -> bool:
    """`o`'s shape is the recorded one, but for dimensions in `free` (sizes from values)."""
    if recorded is None or len(recorded) != o.dim():
        return False
    return all(d in free or s == r for d, (s, r) in enumerate(zip(o.shape, recorded)))


def _cpu(x: Any) -> Any:
    return x.cpu() if isinstance(x, torch.Tensor) and x.device.type != "cpu" else x


def recorded_threads(art: Artifact) -> Optional[int]:
    """The intra-op threads an artefact's reference outputs were recorded at (None: not recorded)."""
    env = art.manifest.environment
    return env.threads if env is not None else None


def replay(
    path: str | Path | Artifact,
    *,
    graphs: Optional[list[str]] = None,
    inputs: str = "saved",
    seed: int = 0,
    device: Optional[str] = None,
    bench: int = 0,
    trust_code: bool = False,
    threads: Optional[int] = None,
) -> list[GraphReplay]:
    """Replay the graphs of an artefact (all, or those named); see replay_graph.

    They run at `threads` intra-op threads, by default the count the artefact's outputs were
    recorded at (manifest.environment), so that on the machine that made it they match bit
    for bit whatever executor made it. Where the environment differs from the recorded one
    (CPU model or features, torch, threads, device), outputs are judged by their evidence;
    where the artefact does not record its CPU, those whose bits differ are."""
    art = path if isinstance(path, Artifact) else load(path, trust_code=trust_code)
    kinds = selected_graphs(art, graphs, threads)
    if inputs == "saved" and not all(art.graphs[k].has_saved_values for k in kinds):
        inputs = "random"  # captured with save_inputs: false
    with intra_op_threads(threads if threads is not None else recorded_threads(art)):
        differs, why_judged = replay_environment(art, device)
        return [replay_graph(art.graphs[k], inputs=inputs, seed=seed, device=device, bench=bench,
                             environment=differs, unrecorded=why_judged) for k in kinds]


def selected_graphs(art: Artifact, graphs: list[str] | None, threads: int | None = None) -> list[str]:
    """The keys of the graphs to replay (all, or those named), a one-line error for a name the
    artefact does not have or a thread count below 1."""
    kinds = graphs or list(art.graphs)
    unknown = [k for k in kinds if k not in art.graphs]
    if unknown:
        raise ArtifactError(f"{art.path}: no {', '.join(unknown)} graph; it has {', '.join(art.graphs)}")
    if threads is not None and threads < 1:
        raise ArtifactError(f"--threads must be at least 1, got {threads}")
    return kinds


def replay_environment(art: Artifact, device: str | None) -> tuple[list[str], str | None]:
    """(why bits cannot match here, why it cannot be told whether they must): this machine,
    torch, thread count and `device` against the artefact's recorded environment (see
    replay_graph's `environment` and `unrecorded`). Call it at the thread count replayed at."""
    try:
        dev = "cpu" if device is None else parse_device(device).type
    except ValueError as e:
        raise ArtifactError(f"--device: {e}") from None
    recorded = art.manifest.environment
    return environment_differences(recorded, current_environment(dev)), unrecorded_cpu(recorded)


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


def replay_chain(path: str | Path | Artifact, *, rebuild_source: bool = True, trust_code: bool = False,
                 threads: Optional[int] = None) -> ChainReplay:
    """Run forward on saved inputs, feed its saved activations to backward, check the gradients,
    at `threads` intra-op threads (default: the count recorded in the manifest).

    Gradients must equal the joint graph's bit for bit, and the rebuilt eager model's under
    the fp64-reference rule of :mod:`aotpipe.runtime.accuracy`. Graphs that do not run give status
    "error" with the reason. A dynamo artefact's chain is checked in every subgraph that has
    forward, backward and joint graphs (problems name the subgraph); the eager model's
    gradients are those of the whole model, so they are compared only when it has one subgraph.
    """
    art = path if isinstance(path, Artifact) else load(path)
    with intra_op_threads(threads if threads is not None else recorded_threads(art)):
        return _replay_chain(art, rebuild_source, trust_code)


def _replay_chain(art: Artifact, rebuild_source: bool, trust_code: bool) -> ChainReplay:
    chains = {i: keys for i, keys in art.subgraph_keys().items() if set(TRAINING_KINDS) <= set(keys)}
    if not chains:
        # name what the most complete subgraph lacks (subgraph 0 first among equals)
        subgraphs = art.subgraph_keys() or {0: {}}
        i, have = max(subgraphs.items(), key=lambda kv: (len(set(TRAINING_KINDS) & set(kv[1])), -kv[0]))
        missing = ", ".join(k for k in TRAINING_KINDS if k not in have)
        where = f" (subgraph {i})" if i else ""
        raise ArtifactError(f"{art.path}: the chain needs forward, backward and joint graphs; "
                            f"{missing} {'is' if ',' not in missing else 'are'} missing{where}")
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
                elif not c.passed:  # a gradient missing on one side: no error figure holds it
                    eager_err = float("inf")
                if not c.passed:
                    eager_ok = False
                    problems.append(f"off the eager model: {c.line()}")
    return ChainReplay("mismatch" if problems else "match", compared, worst, eager_err, eager_ok, problems)


def _grad64(ref: Any, target: str) -> Optional[torch.Tensor]:
    run = ref.run("training", fp64=True)
    return run.grads.get(target) if run is not None else None
