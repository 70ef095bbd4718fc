"""Pipeline YAML -> typed :class:`~aotpipe.spec.Pipeline`, with every error reported at once as file:line.

The YAML is parsed once here (the file's own shape: :class:`PipelineFile`). The rest of
aotpipe sees only the spec types of :mod:`aotpipe.spec`, never raw dicts: defaults are
resolved into each model, dtypes are checked, sources are checked to import.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from aotpipe.errors import ConfigError, LimitError, Problem, SourceError
from aotpipe.format.limits import current, read_bounded
from aotpipe.format.records import RawYaml, library_namespace_problem
from aotpipe.format.vocabulary import DEFAULT_KINDS, KindField
from aotpipe.models.pt2 import pt2_problem
from aotpipe.passes import chain_order_problems, chain_problem, expand_chain, parse_pass_entry
from aotpipe.spec import (  # noqa: F401 (inputs_data's checks, beside)
    DTYPES,
    ZOO_PREFIX,
    DimsField,
    DimSpec,
    ExecutorSpec,
    InputEntry,
    InputSpec,
    Loss,
    Mode,
    ModelSpec,
    PassStep,
    Pipeline,
    ResourceSpec,
    Strict,
    device_problem,
    path_problem,
    source_import_path,
)
from aotpipe.spec.distributed import MESH_DIMS, DistributedSpec
from aotpipe.spec.modes import CAPTURE_MODES
from aotpipe.spec.optim import OptimizerSpec

SCHEMA_VERSION = 1

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def is_name(value: str) -> bool:
    """Whether `value` may name a model or pipeline folder: the whole string (a `$` in a
    pattern would admit a trailing newline), so no separator, no `..`, nothing hidden."""
    return _NAME_RE.fullmatch(value) is not None


class Defaults(Strict):
    """Settings every model inherits and may override."""

    mode: Mode = Field("auto", description="capture mode: auto (export, else dynamo, recording why; the default: "
                       "it captures the most models); export (torch.export + AOTAutograd); dynamo "
                       "(torch.compile with a capturing backend: graphs per subgraph, graph breaks recorded); "
                       "meta (export of the model built on the meta device: shapes only, no values, no memory)")
    graphs: list[KindField] = Field(list(DEFAULT_KINDS), description="graph kinds to save: inference, forward, backward, joint (the default: all four), and train_step (with optimizer:)")
    passes: str | list[str | dict[str, Any]] = Field(
        [], description="pass chain: names (freeze) or {name: {options}}; each applies to `graphs:` "
        "(default [inference]); or a named chain: cpu-fast")
    save_inputs: bool = Field(True, description="save example inputs and reference outputs")
    save_values: Literal["minimal", "full"] = Field(
        "minimal", description="minimal: store what cannot be recomputed (weights, user inputs; reference outputs as "
                               "digests); full: every graph's inputs and outputs, so each graph runs in isolation")
    verify: bool = Field(True, description="check every graph after writing it: against eager, and the chain")
    loss: Loss = Field(
        "weighted", description="the training loss the forward, backward and joint graphs differentiate (modes "
        "export, meta, auto), over floating-point outputs: weighted, the sum of their elements each times a fixed "
        "non-uniform weight (1 + sum over dimensions d of ((3 i_d + d) mod 7) / 8), so no gradient is zero merely "
        "because the loss is constant; sum, of their elements' sum; or mean, of their mean (gradients seeded with "
        "1/numel, as a mean-reduced training loss)")
    dims: DimsField | None = Field(
        default=None, description="named dynamic dimensions, each {min, max, example}: an input's shape names them "
        "([batch, seq]) and every graph is captured with that size symbolic, checked at min, example and max; or "
        "auto: every input's leading dimension dynamic, reported as dynamic or specialised (a model's dims add to "
        "and override the defaults')")
    optimizer: OptimizerSpec | None = Field(
        default=None, description="the optimizer a train_step graph updates the parameters with: {name: adamw, lr: "
        "1e-3, weight_decay: 0.01, ...}, name one of sgd, adam, adamw, adagrad, rmsprop and the rest the torch class's "
        "arguments (foreach too); with clip_grad_norm (clip the gradients' norm first) and warmup_steps (eager steps "
        "before capture, default 1)")


class ModelEntry(Strict):
    """One model as written in the YAML; unset fields inherit from `defaults`."""

    name: str = Field(description="unique name; becomes the artefact folder name")
    source: str = Field(description="'module:callable', 'aotpipe.zoo:<name>', 'hf:<ClassName>', 'pt2:<path>' "
                                    "(a torch.export archive, relative to the pipeline file), or 'torch-op:<name>' / "
                                    "'torch-module:<name>' (an entry of torch's op_db / module_db: args {sample: K} "
                                    "picks its sample, which supplies the inputs)")
    args: dict[str, Any] = Field({}, description="keyword arguments for a module:callable source")
    config: dict[str, Any] | None = Field(None, description="transformers config fields for an hf: source")
    inputs: list[InputEntry] | None = Field(
        None, description="example inputs (required, except for torch-op and torch-module sources, whose sample "
        "supplies them)")
    forward_args: dict[str, Any] | None = Field(
        None, description="keyword arguments of forward that are not tensors (flags, numbers, strings, lists of "
        "them), by name or path (batch.train): constants of the captured graphs")
    device: str | None = Field(
        None, description="where the model and its inputs are captured: cpu (the default), cuda or cuda:N (a GPU "
        "this machine has)")

    @field_validator("device")
    @classmethod
    def _device_form(cls, v: str | None) -> str | None:
        problem = device_problem(v) if v is not None else None
        if problem is not None:
            raise ValueError(problem)
        return v
    mode: Mode | None = None
    graphs: list[KindField] | None = None
    passes: str | list[str | dict[str, Any]] | None = None
    save_inputs: bool | None = None
    save_values: Literal["minimal", "full"] | None = None
    verify: bool | None = None
    loss: Loss | None = None
    dims: DimsField | None = Field(
        default=None, description="named dynamic dimensions, each {min, max, example}: an input's shape names them "
        "([batch, seq]) and every graph is captured with that size symbolic, checked at min, example and max; or "
        "auto: every input's leading dimension dynamic, reported as dynamic or specialised (a model's dims add to "
        "and override the defaults')")
    optimizer: OptimizerSpec | None = Field(
        default=None, description="the optimizer a train_step graph updates the parameters with: {name: adamw, lr: "
        "1e-3, weight_decay: 0.01, ...}, name one of sgd, adam, adamw, adagrad, rmsprop and the rest the torch class's "
        "arguments (foreach too); with clip_grad_norm (clip the gradients' norm first) and warmup_steps (eager steps "
        "before capture, default 1)")
    resources: ResourceSpec | None = Field(
        None, description="this model's own CPUs, GPUs, memory and time limit (override the executor's)")
    distributed: DistributedSpec | None = Field(
        None, description="capture the model as every rank of a parallel world on one machine: {world_size: 4, "
        "strategy: fsdp2} (ddp, fsdp2, tp, fsdp2+tp, ddp+tp; the 2-D ones with mesh: [dp, tp]; tp_plan: module "
        "pattern -> colwise | rowwise): each rank's graphs with their collectives, checked together over gloo")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not is_name(v):
            raise ValueError(
                f"model name {v!r} is not a safe folder name; use letters, digits, '_', '.', '-'"
            )
        if v in ("run.json", "report.md", "report.html", "bench.json"):
            raise ValueError(f"model name {v!r} is the name of a run report; choose another")
        return v

    @field_validator("source")
    @classmethod
    def _source_form(cls, v: str) -> str:
        if v.startswith("hf:"):
            if not v[3:].isidentifier():
                raise ValueError(f"source {v!r}: after 'hf:' put a transformers class name, e.g. hf:BertModel")
            return v
        if v.startswith(("torch-op:", "torch-module:")):
            if not v.partition(":")[2]:
                raise ValueError(f"source {v!r}: after {v.partition(':')[0]}: put an entry name of torch's database, "
                                 "e.g. torch-op:add or torch-module:nn.Linear")
            return v
        if v.startswith("pt2:"):
            if not v[4:]:
                raise ValueError(f"source {v!r}: after 'pt2:' put the path of a torch.export archive, e.g. pt2:model.pt2")
            return v
        module, sep, attr = v.partition(":")
        if not sep or not module or not attr:
            raise ValueError(
                f"source {v!r} is not 'module:callable' (e.g. aotpipe.zoo:mlp) or 'hf:<ClassName>'"
            )
        return v


class PipelineFile(Strict):
    """The pipeline YAML, schema version 1, exactly as written."""

    version: Literal[1] = Field(description="schema version; this aotpipe reads 1")
    name: str = Field(description="pipeline name; artefacts go in <output>/<name>/")
    output: str = Field("artifacts", description="output folder, relative to the working directory")
    seed: int = Field(0, description="seed for weights and example inputs")
    executor: ExecutorSpec = ExecutorSpec()
    trusted_ops: list[str] = Field(
        [], description="library op namespaces (e.g. transformers) whose custom ops with no ATen decomposition "
        "the graphs may keep; recorded in each manifest, and a loader runs them only with --trust-ops")
    defaults: Defaults = Defaults()
    models: list[ModelEntry] = Field(min_length=1, description="the models to capture")

    @field_validator("trusted_ops")
    @classmethod
    def _namespaces(cls, v: list[str]) -> list[str]:
        for ns in v:
            why = library_namespace_problem(ns)
            if why:
                raise ValueError(f"trusted_ops: {why}")
        return sorted(set(v))

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not is_name(v):
            raise ValueError(f"pipeline name {v!r} is not a safe folder name; use letters, digits, '_', '.', '-'")
        return v




# ---------------------------------------------------------------------------------------
# YAML with line numbers


class _AliasCycle(Exception):
    """An alias refers to a node that contains it."""


class _TooManyValues(Exception):
    """The document's aliases expand to more values than the limit."""


def _check_expansion(root: yaml.Node, limit: int) -> None:
    """Count the values the document has once aliases are expanded, without expanding them:
    a few hundred bytes of nested aliases ("billion laughs") expand to billions."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]

    def children(n: yaml.Node) -> list[yaml.Node]:
        if isinstance(n, yaml.MappingNode):
            return [x for kv in n.value for x in kv]
        return list(n.value) if isinstance(n, yaml.SequenceNode) else []

    while stack:
        n, finished = stack.pop()
        if finished:
            visiting.discard(id(n))
            sizes[id(n)] = min(limit + 1, 1 + sum(sizes[id(c)] for c in children(n)))
            continue
        if id(n) in sizes:
            continue
        if id(n) in visiting:
            raise _AliasCycle
        visiting.add(id(n))
        stack.append((n, True))
        stack.extend((c, False) for c in children(n))
    if sizes[id(root)] > limit:
        raise _TooManyValues


def _compose_with_lines(text: str) -> tuple[RawYaml, dict[tuple, int], list[tuple[int, tuple, str]]]:
    """Parse YAML into plain data, a map from field path to 1-based line, and duplicate keys."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[tuple, int] = {}
    duplicates: list[tuple[int, tuple, str]] = []
    if node is None:
        return None, lines, duplicates
    _check_expansion(node, current().max_yaml_values)
    constructor = yaml.SafeLoader("")

    def walk(n: yaml.Node, path: tuple) -> Any:
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for k, v in n.value:
                key = constructor.construct_object(k, deep=True)
                if isinstance(key, (list, dict)):
                    key = str(key)
                if key in out:
                    duplicates.append((k.start_mark.line + 1, path + (key,), f"{key!r} appears twice in this mapping; keep one"))
                lines[path + (key,)] = k.start_mark.line + 1
                out[key] = walk(v, path + (key,))
                lines[path + (key,)] = k.start_mark.line + 1
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(v, path + (i,)) for i, v in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

    return walk(node, ()), lines, duplicates


def _line_for(lines: dict[tuple, int], loc: tuple) -> int | None:
    for i in range(len(loc), -1, -1):
        if loc[:i] in lines:
            return lines[loc[:i]]
    return None


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names accepted at `loc` (a pydantic error location), for hints."""
    t: Any = model
    for part in loc:
        while get_origin(t) in (Union, types.UnionType):
            args = [a for a in get_args(t) if a is not type(None)]
            t = args[0]
        if isinstance(part, int):
            args = get_args(t)
            t = args[0] if args else Any
        elif isinstance(t, type) and issubclass(t, BaseModel) and part in t.model_fields:
            t = t.model_fields[part].annotation
        else:
            return []
    while get_origin(t) in (Union, types.UnionType):
        t = [a for a in get_args(t) if a is not type(None)][0]
    if isinstance(t, type) and issubclass(t, BaseModel):
        return list(t.model_fields)
    return []


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _data_loc(data: RawYaml, loc: tuple, kind: str) -> tuple:
    """The part of a pydantic error location that indexes the YAML data.

    Pydantic adds union-member tags ('int', 'float', 'function-after[...]') to locations;
    they are dropped by following the location through the data itself, so a user key
    that happens to be called 'int' is kept.
    """
    out: list = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and any(str(k) == part for k in node):
            key = next(k for k in node if str(k) == part)  # pydantic names a null key 'None'
            out.append(key)
            node = node[key]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and kind == "missing" and i == len(loc) - 1:
            out.append(part)
        elif isinstance(node, dict) or isinstance(node, list):
            continue  # a tag between two data levels
        else:
            break  # below a scalar: only tags remain
    return tuple(out)


def _problem_from_pydantic(path: str, lines: dict[tuple, int], data: RawYaml, err: ErrorDetails) -> Problem:
    loc = _data_loc(data, tuple(err["loc"]), err["type"])
    kind = err["type"]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if kind == "extra_forbidden":
        valid = _fields_at(PipelineFile, loc[:-1])
        msg = f"unknown key {loc[-1]!r}" + (f"; valid keys here: {', '.join(valid)}" if valid else "")
    elif kind == "missing":
        msg = f"missing required field {loc[-1]!r}; add it"
        if loc[-1] == "source":
            msg += " (e.g. source: aotpipe.zoo:mlp)"
    elif kind == "literal_error" and loc == ("version",):
        msg = f"schema version {err.get('input')!r} is not one this aotpipe reads; set version: 1"
    elif "input" in err and kind not in ("value_error",) and not isinstance(err["input"], (dict, list)):
        msg = f"{msg} (got {err['input']!r})"
    # A missing mapping key has no line of its own: point at its parent.
    return Problem(path, _line_for(lines, loc), _field_path(loc), msg)


def _check_duplicates(path: str, lines: dict[tuple, int], data: RawYaml) -> list[Problem]:
    problems = []
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return problems
    seen: dict[str, int] = {}
    for i, m in enumerate(models):
        if isinstance(m, dict) and isinstance(m.get("name"), str):
            name = m["name"]
            line = lines.get(("models", i, "name"))
            if name in seen:
                problems.append(
                    Problem(
                        path, line, f"models[{i}].name",
                        f"duplicate model name {name!r} (first at line {seen[name]}); names must be unique",
                    )
                )
            else:
                seen[name] = line or 0
    return problems


def load_pipeline(path: str | Path, *, check_sources: bool = True) -> Pipeline:
    """Read and validate a pipeline YAML; raise ConfigError listing every problem found."""
    p = Path(path)
    shown = str(path)
    try:
        data = read_bounded(p, limit=current().max_yaml_bytes, limit_name="max_yaml_bytes")
    except FileNotFoundError:
        raise ConfigError([Problem(shown, None, "", "no such file; check the path")]) from None
    except LimitError as e:
        raise ConfigError([Problem(shown, None, "", str(e).removeprefix(f"{p}: "))]) from None
    except OSError as e:
        raise ConfigError([Problem(shown, None, "", f"cannot read the file ({e.__class__.__name__}: {e.strerror})")]) \
            from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError([Problem(shown, line, "", f"not UTF-8 text: byte {data[e.start]:#04x} at column {column} "
                                                    f"(byte {e.start}); save the file as UTF-8")]) from None
    return parse_pipeline(text, shown, base_dir=p.resolve().parent, check_sources=check_sources)


def parse_pipeline(
    text: str, path: str = "<string>", *, base_dir: Path | None = None, check_sources: bool = True
) -> Pipeline:
    """Validate pipeline YAML text; `path` only names the file in error messages."""
    data: RawYaml  # checked here key by key, so that every problem is reported with its line
    try:
        data, lines, duplicate_keys = _compose_with_lines(text)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (a NUL, a control character)
        line = text.count("\n", 0, e.position) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        raise ConfigError([Problem(path, line, "", f"malformed YAML: character #x{code:04x} is not allowed "
                                   f"({e.reason}); remove it")]) from None
    except _TooManyValues:
        limit = current().max_yaml_values
        raise ConfigError([Problem(path, None, "", f"its aliases expand to more than {limit:,} values, over the "
                                   "limit (raise it with AOTPIPE_MAX_YAML_VALUES); write the values out "
                                   "instead of nesting aliases")]) from None
    except _AliasCycle:
        raise ConfigError([Problem(path, None, "", "malformed YAML: an alias refers to itself (&a ... *a); "
                                   "replace the recursive alias with plain values")]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        last_line = max(1, len(text.splitlines()))
        context = getattr(e, "context_mark", None)
        if line is not None and line > last_line:
            # The parser hit the end of the file (an unclosed bracket or quote): point at
            # where the unclosed construct began, or at the last line.
            line = context.line + 1 if context is not None else last_line
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([Problem(path, line, "", f"malformed YAML: {problem}; fix the syntax")]) from None
    except RecursionError:
        raise ConfigError([Problem(path, None, "", "malformed YAML: nested deeper than aotpipe parses; "
                                   "flatten the structure")]) from None
    except (ValueError, TypeError) as e:
        raise ConfigError([Problem(path, None, "", f"malformed YAML: {e}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [Problem(path, 1, "", "a pipeline must be a mapping with version, name and models; see `aotpipe schema`")]
        )

    problems: list[Problem] = [
        Problem(path, line, _field_path(loc), msg) for line, loc, msg in duplicate_keys
    ]
    parsed: PipelineFile | None = None
    try:
        parsed = PipelineFile.model_validate(data)
    except ValidationError as e:
        problems.extend(_problem_from_pydantic(path, lines, data, err) for err in e.errors())
    problems.extend(_check_duplicates(path, lines, data))

    if check_sources:
        models = data.get("models") if isinstance(data.get("models"), list) else []
        problems.extend(_source_problems(path, [
            (i, lines.get(("models", i, "source")), m["source"]) for i, m in enumerate(models)
            if isinstance(m, dict) and isinstance(m.get("source"), str)], base_dir))

    problems.extend(_check_field_combinations(path, lines, data))
    problems.extend(_dims_problems(path, lines, data))
    problems.extend(_train_step_problems(path, lines, data))
    problems.extend(_distributed_problems(path, lines, data))
    chain_problems, chains = _pass_chains(path, lines, data)
    problems.extend(chain_problems)
    resolved = None
    if not problems:
        assert parsed is not None
        resolved = _resolve(parsed, path, chains, {m.get("name"): (i, lines.get(("models", i, "source"))) for i, m in
                                           enumerate(data.get("models") or []) if isinstance(m, dict)})
        if check_sources:
            problems.extend(_output_problems(path, lines, resolved))
            problems.extend(_model_problems(path, lines, resolved, base_dir))
            problems.extend(_input_problems(path, lines, resolved, base_dir))
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.field))
        raise ConfigError(problems)
    assert resolved is not None
    return resolved


def output_problem(output: str | Path) -> str | None:
    """Why `output` cannot hold the artefacts (it, or a folder above it, is a file); None if it can."""
    p = Path(output)
    for q in (p, *p.parents):
        if q.exists():
            if q.is_dir():
                return None
            what = "is a file" if q == p else f"lies under {q}, which is a file"
            return f"{str(output)!r} {what}, not a folder; choose another output folder"
    return None


def _output_problems(path: str, lines: dict[tuple, int], pipeline: Pipeline) -> list[Problem]:
    """`output:` (relative to the working directory, as run reads it) naming a file."""
    msg = output_problem(pipeline.output) or output_problem(Path(pipeline.output) / pipeline.name)
    return [Problem(path, lines.get(("output",)), "output", msg)] if msg else []


def _model_problems(path: str, lines: dict[tuple, int], pipeline: Pipeline, base_dir: Path | None) -> list[Problem]:
    """What importing and building each model shows: `args` its callable does not take (or of
    another type than it annotates), `config:` keys its transformers config class does not
    take, a build that fails (heads that do not divide the hidden size), and integer input
    ranges that do not fit the embedding tables they index. Models are built on the meta
    device: nothing is allocated, nothing is computed."""
    from aotpipe.models.sources import args_problem, config_key_problems, embedding_range_problems, meta_build  # torch
    from aotpipe.models.torch_corpus import eager_problem, is_corpus_source  # torch

    problems = []
    for i, spec in enumerate(pipeline.models):
        wrong_keys = config_key_problems(spec.source, spec.config)
        for key, msg in wrong_keys:
            problems.append(Problem(path, lines.get(("models", i, "config", key)) or lines.get(("models", i, "config")),
                                    f"models[{i}].config.{key}", msg))
        if wrong_keys:
            continue  # the model would be built from another config than the one meant
        bad_args = args_problem(spec, base_dir)
        if bad_args is not None:
            name, msg = bad_args
            where = ("models", i, "args", name) if name else ("models", i, "args")
            problems.append(Problem(path, lines.get(where) or lines.get(("models", i, "args"))
                                    or lines.get(("models", i, "source")),
                                    f"models[{i}].args" + (f".{name}" if name else ""), msg))
            continue  # the model cannot be built with these args
        if is_corpus_source(spec.source):
            msg = eager_problem(spec)
            if msg is not None:
                problems.append(Problem(path, lines.get(("models", i, "args", "sample")) or lines.get(("models", i, "source")),
                                        f"models[{i}].args.sample" if "sample" in spec.args else f"models[{i}].source",
                                        msg))
            continue
        model, msg = meta_build(spec, base_dir) if spec.source.startswith("hf:") or any(
            inp.is_integer and inp.high is not None for inp in spec.inputs) else (None, None)
        if msg is not None:
            where = ("models", i, "config") if spec.config else ("models", i, "source")
            problems.append(Problem(path, lines.get(where) or lines.get(("models", i, "source")), _field_path(where), msg))
            continue
        for j, msg in embedding_range_problems(spec, base_dir, model):
            problems.append(Problem(path, lines.get(("models", i, "inputs", j, "high"))
                                    or lines.get(("models", i, "inputs", j)),
                                    f"models[{i}].inputs[{j}].high", msg))
    return problems


def _input_problems(path: str, lines: dict[tuple, int], pipeline: Pipeline, base_dir: Path | None) -> list[Problem]:
    """Inputs beyond random tensors (aotpipe/models/inputs_data.py): input paths that clash, `key`
    without `data`, and data that cannot be read or is not the declared tensor."""
    from aotpipe.models.inputs_data import call_template, device_unavailable, is_structured, load_input_tensor  # torch
    from aotpipe.models.sources import resolve_callable  # torch

    problems = []
    for i, spec in enumerate(pipeline.models):
        missing = device_unavailable(spec.device)
        if missing is not None:
            problems.append(Problem(path, lines.get(("models", i, "device")), f"models[{i}].device", missing))
        if is_structured(spec):
            try:
                call_template(spec)
            except SourceError as e:
                problems.append(Problem(path, lines.get(("models", i, "inputs")), f"models[{i}].inputs",
                                        str(e).removeprefix(f"model {spec.name!r}: ")))
        for j, inp in enumerate(spec.inputs):
            field = f"models[{i}].inputs[{j}]"
            line = lines.get(("models", i, "inputs", j, "data")) or lines.get(("models", i, "inputs", j))
            if inp.key is not None and inp.data is None:
                problems.append(Problem(path, lines.get(("models", i, "inputs", j, "key")), f"{field}.key",
                                        "key picks a tensor from data; add data, or remove key"))
            elif inp.data is not None:
                try:
                    load_input_tensor(inp, base_dir, field, resolve_callable)
                except SourceError as e:
                    msg = str(e)
                    sub = msg.split(":", 1)[0]
                    problems.append(Problem(path, line, sub, msg[len(sub) + 2:]))
    return problems


def _check_field_combinations(path: str, lines: dict[tuple, int], data: RawYaml) -> list[Problem]:
    problems = []
    models = data.get("models") if isinstance(data.get("models"), list) else []
    defaults = data.get("defaults") if isinstance(data.get("defaults"), dict) else {}
    ex = data.get("executor") if isinstance(data.get("executor"), dict) else {}
    recycle, limit = ex.get("recycle_memory_gb"), ex.get("memory_gb")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (recycle, limit)) \
            and recycle >= limit:
        problems.append(
            Problem(path, _line_for(lines, ("executor", "recycle_memory_gb")), "executor.recycle_memory_gb",
                    f"{recycle:g} GiB is not below memory_gb ({limit:g} GiB): a worker would be killed before it is "
                    "recycled; set recycle_memory_gb below memory_gb")
        )
    for i, m in enumerate(models):
        if not isinstance(m, dict) or not isinstance(m.get("source"), str):
            continue
        is_hf = m["source"].startswith("hf:")
        corpus = m["source"].startswith(("torch-op:", "torch-module:"))
        if corpus and m.get("inputs") is not None:
            problems.append(
                Problem(path, lines.get(("models", i, "inputs")), f"models[{i}].inputs",
                        "a torch-op or torch-module source takes its inputs from its sample (args: {sample: K}); "
                        "remove inputs")
            )
        elif not corpus and "inputs" not in m:
            problems.append(
                Problem(path, lines.get(("models", i)), f"models[{i}].inputs", "missing required field 'inputs'; add it")
            )
        if corpus and m.get("mode", defaults.get("mode")) == "meta":
            where = ("models", i, "mode") if "mode" in m else ("defaults", "mode")
            problems.append(
                Problem(path, _line_for(lines, where), f"models[{i}].mode",
                        "mode meta builds no values, but a torch-op or torch-module source is its sample's values; "
                        "use mode auto, export or dynamo")
            )
        if m.get("config") is not None and not is_hf:
            problems.append(
                Problem(path, lines.get(("models", i, "config")), f"models[{i}].config",
                        "config is only for hf: sources; pass constructor arguments with args")
            )
        if m.get("args") and is_hf:
            problems.append(
                Problem(path, lines.get(("models", i, "args")), f"models[{i}].args",
                        "hf: sources are built from config; move these fields under config")
            )
        mode = m.get("mode", defaults.get("mode"))
        passes = m.get("passes", defaults.get("passes"))
        # The raw YAML: a mode that is not a string (a list, a mapping) is the schema's error to report.
        if isinstance(mode, str) and mode in CAPTURE_MODES and not CAPTURE_MODES[mode].values and passes:
            where = ("models", i, "passes") if "passes" in m else ("defaults", "passes")
            problems.append(
                Problem(path, lines.get(where) or lines.get(("models", i, "mode")), f"models[{i}].passes",
                        f"mode {mode} captures shapes only, and passes need values; set passes: [] for this model, "
                        "or use mode export")
            )
        inputs = m.get("inputs") if isinstance(m.get("inputs"), list) else []
        named = False
        for j, inp in enumerate(inputs):
            dtype = inp.get("dtype", "float32") if isinstance(inp, dict) else None
            if isinstance(inp, dict) and inp.get("requires_grad") is True and isinstance(dtype, str) \
                    and DTYPES.get(dtype, "float32") in ("int64", "int32", "int16", "int8", "uint8", "bool"):
                problems.append(
                    Problem(path, lines.get(("models", i, "inputs", j, "requires_grad")),
                            f"models[{i}].inputs[{j}].requires_grad",
                            f"a {dtype} input has no gradient; set requires_grad: false, or make it a floating-point "
                            "input")
                )
            if isinstance(inp, dict) and inp.get("name") is not None:
                named = True
            elif named:
                problems.append(
                    Problem(path, lines.get(("models", i, "inputs", j)), f"models[{i}].inputs[{j}]",
                            "a positional input (no name) follows a named one; put positional inputs first")
                )
    return problems


def _declared_dims(defaults: RawYaml, model: RawYaml) -> tuple[bool, dict[str, Any]]:
    """(auto, the named dimensions) a model's `dims:` gives, over the defaults' (raw YAML or
    parsed: a model's own names add to and override the defaults'; its `auto` replaces them)."""
    own, inherited = model.get("dims"), defaults.get("dims")
    if own == "auto" or (own is None and inherited == "auto"):
        return True, {}
    merged = dict(inherited) if isinstance(inherited, dict) else {}
    merged.update(own if isinstance(own, dict) else {})
    return False, merged


def _raw_models(data: RawYaml) -> tuple[dict[str, RawYaml], list[tuple[int, dict[str, RawYaml]]]]:
    """The raw YAML's defaults and its models that are mappings, with their index in `models:`
    (for the checks made before the file validates: malformed parts are pydantic's to report)."""
    models: list[RawYaml] = data.get("models") if isinstance(data.get("models"), list) else []
    defaults: dict[str, RawYaml] = data.get("defaults") if isinstance(data.get("defaults"), dict) else {}
    return defaults, [(i, m) for i, m in enumerate(models) if isinstance(m, dict)]


def _dims_problems(path: str, lines: dict[tuple, int], data: RawYaml) -> list[Problem]:
    """Named dimensions used as declared: every name in a shape declared under dims:, none on a
    loaded input (data:), none with dims: auto or a mode that captures static sizes, and every
    dimension a model declares itself used by one of its inputs."""
    problems = []
    defaults: RawYaml
    m: RawYaml
    defaults, models = _raw_models(data)
    for i, m in models:
        auto, declared = _declared_dims(defaults, m)
        mode = m.get("mode", defaults.get("mode", "auto"))
        if (auto and mode == "dynamo") or ((auto or declared) and mode == "meta"):
            dims_at = ("models", i, "dims") if "dims" in m else ("defaults", "dims")
            problems.append(Problem(path, _line_for(lines, dims_at), f"models[{i}].dims",
                                    f"mode {mode} takes no dims: auto; name the dimensions (dims: {{batch: ...}}), "
                                    "or use mode export or auto" if mode == "dynamo" else
                                    "mode meta captures static sizes; use mode export or auto for dims, "
                                    "or remove dims for this model"))
        used: set[str] = set()
        raw_inputs = m.get("inputs")
        inputs: list[RawYaml] = raw_inputs if isinstance(raw_inputs, list) else []
        for j, inp in enumerate(inputs):
            shape = inp.get("shape") if isinstance(inp, dict) else None
            names = [(k, d) for k, d in enumerate(shape) if isinstance(d, str)] if isinstance(shape, list) else []
            for k, name in names:
                where = ("models", i, "inputs", j, "shape", k)
                if auto:
                    problems.append(Problem(path, _line_for(lines, where), f"models[{i}].inputs[{j}].shape[{k}]",
                                            f"names dimension {name!r}, but dims: auto picks the dynamic dimensions "
                                            "itself; write the size as a number, or declare the dimension by name "
                                            "under dims:"))
                elif name not in declared:
                    problems.append(Problem(path, _line_for(lines, where), f"models[{i}].inputs[{j}].shape[{k}]",
                                            f"names dimension {name!r}, which dims: does not declare; declare it "
                                            f"({name}: {{min: 1, max: 64, example: 4}} under dims:) or write a number"))
                elif inp.get("data") is not None:
                    problems.append(Problem(path, _line_for(lines, where), f"models[{i}].inputs[{j}].shape[{k}]",
                                            f"names dimension {name!r}, but the input is loaded from data: (one fixed "
                                            "size); write its sizes as numbers, or draw it (remove data)"))
                used.add(name)
        raw_dims = m.get("dims")
        own: dict[str, RawYaml] = raw_dims if isinstance(raw_dims, dict) else {}
        for name in own:
            if name not in used and inputs:
                problems.append(Problem(path, _line_for(lines, ("models", i, "dims", name)), f"models[{i}].dims.{name}",
                                        f"dimension {name!r} is declared but no input's shape names it; name it in a "
                                        "shape ([batch, 16]) or remove it"))
    return problems


def _train_step_problems(path: str, lines: dict[tuple, int], data: RawYaml) -> list[Problem]:
    """A model whose graphs list train_step has an optimizer, a mode that captures export's
    joint (export or auto) and static sizes (the step is traced at the example's)."""
    problems = []
    defaults: RawYaml
    m: RawYaml
    defaults, models = _raw_models(data)
    for i, m in models:
        graphs = m.get("graphs", defaults.get("graphs"))
        if not isinstance(graphs, list) or "train_step" not in graphs:
            continue
        at = ("models", i, "graphs") if "graphs" in m else ("defaults", "graphs")
        where, line = f"models[{i}].graphs", _line_for(lines, at)
        mode = m.get("mode", defaults.get("mode", "auto"))
        auto, declared = _declared_dims(defaults, m)
        if m.get("optimizer", defaults.get("optimizer")) is None:
            problems.append(Problem(path, line, where, "graphs lists train_step, which needs an optimizer; add "
                                    "optimizer: {name: adamw, lr: 1e-3} (to the model or to defaults)"))
        if mode in ("dynamo", "meta"):
            problems.append(Problem(path, line, where, f"train_step is made from export's joint graph, and mode "
                                    f"{mode} does not capture one; use mode export or auto, or leave train_step out"))
        if auto or declared:
            problems.append(Problem(path, line, where, "train_step is traced at the example sizes only; remove dims "
                                    "for this model, or leave train_step out"))
    return problems


def _pass_chains(path: str, lines: dict[tuple, int], data: RawYaml) -> tuple[list[Problem], dict[tuple, list[PassStep]]]:
    """Every `passes:` of the YAML (the defaults' and each model's) parsed once, into its one
    form, a list of typed steps: the problems, and the chains that have none, by location."""
    problems: list[Problem] = []
    chains: dict[tuple, list[PassStep]] = {}
    models = data.get("models") if isinstance(data.get("models"), list) else []
    defaults = data.get("defaults") if isinstance(data.get("defaults"), dict) else {}
    for loc, passes in [(("defaults", "passes"), defaults.get("passes"))] + [
        (("models", i, "passes"), m.get("passes")) for i, m in enumerate(models) if isinstance(m, dict)
    ]:
        if isinstance(passes, str) and chain_problem(passes):
            problems.append(Problem(path, _line_for(lines, loc), _field_path(loc), chain_problem(passes)))
        elif isinstance(passes, (str, list)):
            found, entries = len(problems), expand_chain(passes)
            steps: list[tuple[int, PassStep | None]] = []
            for j, entry in enumerate(entries):
                if not isinstance(entry, (str, dict)):
                    continue  # pydantic already reports the wrong type
                entry_problems, step = parse_pass_entry(entry)
                for sub, msg in entry_problems:
                    where = loc + (j,) + sub
                    problems.append(Problem(path, _line_for(lines, where), _field_path(where), msg))
                steps.append((j, step))
            names = [step.name if step is not None else "" for _, step in steps]
            for k, msg in chain_order_problems(names):
                where = loc + (steps[k][0],)
                problems.append(Problem(path, _line_for(lines, where), _field_path(where), msg))
            if len(problems) == found and len(steps) == len(entries):
                chains[loc] = [step for _, step in steps if step is not None]
    return problems, chains


def _distributed_problems(path: str, lines: dict[tuple, int], data: RawYaml) -> list[Problem]:
    """A distributed model is captured by AOTAutograd on the ranks' mesh (mode export or auto),
    at static sizes, with no pass chain and no train_step yet, on the CPU; and a
    data-parallel strategy's batch divides over the data-parallel ranks."""
    problems = []
    defaults: RawYaml
    m: RawYaml
    defaults, models = _raw_models(data)
    for i, m in models:
        d = m.get("distributed")
        if not isinstance(d, dict):
            continue
        where, line = f"models[{i}].distributed", _line_for(lines, ("models", i, "distributed"))
        mode = m.get("mode", defaults.get("mode", "auto"))
        if mode in ("dynamo", "meta"):
            problems.append(Problem(path, line, where, f"a distributed model's ranks are traced by AOTAutograd on "
                                    f"their mesh, which mode {mode} does not do; use mode export or auto"))
        auto, declared = _declared_dims(defaults, m)
        if auto or declared:
            problems.append(Problem(path, line, where, "a distributed model is captured at the example sizes "
                                    "only; remove dims for this model"))
        graphs = m.get("graphs", defaults.get("graphs"))
        if isinstance(graphs, list) and "train_step" in graphs:
            problems.append(Problem(path, line, where, "train_step is not captured for distributed models yet; "
                                    "leave train_step out of graphs"))
        if m.get("passes", defaults.get("passes")):
            problems.append(Problem(path, line, where, "passes are not applied to distributed graphs yet (they "
                                    "would reorder collectives unchecked); set passes: [] for this model"))
        if m.get("device", "cpu") != "cpu":
            problems.append(Problem(path, line, where, "distributed capture runs on the CPU (a fake process group, "
                                    "checked over gloo); remove device"))
        strategy, mesh, world = d.get("strategy"), d.get("mesh"), d.get("world_size")
        if isinstance(strategy, str) and "dp" in MESH_DIMS.get(strategy, ()) and isinstance(world, int):
            dp = mesh[0] if isinstance(mesh, list) and mesh and isinstance(mesh[0], int) else world
            for j, inp in enumerate(m.get("inputs") or []):
                shape = inp.get("shape") if isinstance(inp, dict) else None
                if isinstance(shape, list) and shape and isinstance(shape[0], int) and dp > 0 and shape[0] % dp:
                    problems.append(Problem(
                        path, _line_for(lines, ("models", i, "inputs", j, "shape")), f"models[{i}].inputs[{j}].shape",
                        f"strategy {strategy} splits the batch (the first dimension, {shape[0]}) over {dp} "
                        f"data-parallel ranks, which does not divide it; make it a multiple of {dp}"))
    return problems


def _source_problems(path: str, sources: list[tuple[int, int | None, str]],
                     base_dir: Path | None) -> list[Problem]:
    """Problems of (index, line, source) entries whose source does not resolve (imports them)."""
    from aotpipe.models.sources import check_source  # torch: kept off the torch-free path

    problems = []
    for i, line, source in sources:
        try:
            ModelEntry._source_form(source)  # malformed ones are reported by pydantic
        except ValueError:
            continue
        msg = check_source(source, base_dir=base_dir)
        if msg:
            problems.append(Problem(path, line, f"models[{i}].source", msg))
    return problems


def check_sources(pipeline: Pipeline, specs: list[ModelSpec]) -> None:
    """Raise ConfigError (file:line) if the source of any of `specs` cannot be found.

    `aotpipe run` loads a pipeline without importing its sources, and checks those of the
    models it has to run without importing them either (the module is found on the path;
    a transformers class is listed by transformers), so that neither torch nor the models'
    code is imported in the parent of the workers that will import them. An error that
    only importing shows (an attribute the module lacks) is the model's failure, stage
    source; `aotpipe validate` imports every source."""
    import importlib.util

    base_dir = Path(pipeline.path).resolve().parent if Path(pipeline.path).exists() else None
    problems = []
    hf_classes: set[str] | None = None
    for s in specs:
        i, line = pipeline.source_lines.get(s.name, (0, None))
        msg = None
        if s.source.startswith("hf:"):
            try:
                import transformers  # lazy: lists its classes without importing them (or torch)
            except ImportError:
                msg = f"{s.source!r} needs transformers; install the extra: pip install 'aotpipe[hf]' -c constraints.txt"
            else:
                if hf_classes is None:
                    hf_classes = set(dir(transformers))  # listing them costs ~0.1 s: once, not per model
                if s.source[3:] not in hf_classes:
                    msg = (f"transformers has no model class {s.source[3:]!r}; use a class such as BertModel or "
                           "LlamaForCausalLM")
        elif s.source.startswith("pt2:"):
            msg = pt2_problem(s.source, base_dir)
        elif s.source.startswith(("torch-op:", "torch-module:")):
            continue  # torch's test databases are imported by the job (seconds); it reports an unknown name
        elif s.source.startswith(ZOO_PREFIX):
            continue  # the builtin zoo: a table the job looks the name up in (it names the models it has)
        else:
            module = s.source.partition(":")[0]
            with source_import_path(base_dir):  # where the job finds it: beside the pipeline, or the working folder
                try:
                    found = importlib.util.find_spec(module)
                except Exception:  # a parent package that does not import: the job says why
                    found = True
            if found is None:
                msg = f"cannot import module {module!r} (no module named {module!r}); check the module path, or install it"
        if msg:
            problems.append(Problem(pipeline.path, line, f"models[{i}].source", msg))
    if problems:
        raise ConfigError(problems)


def _resolve(f: PipelineFile, path: str, chains: dict[tuple, list[PassStep]],
             source_lines: dict[str, tuple[int, int | None]]) -> Pipeline:
    d = f.defaults
    models = []
    for i, m in enumerate(f.models):
        pick = lambda name: getattr(m, name) if getattr(m, name) is not None else getattr(d, name)  # noqa: E731
        auto, declared = _declared_dims({"dims": d.dims}, {"dims": m.dims})
        inputs = [_resolved_input(inp, declared) for inp in m.inputs or []]
        used = {name for inp in inputs for name in inp.dims if name is not None}
        models.append(
            ModelSpec(
                name=m.name,
                source=m.source,
                args=m.args,
                config=m.config,
                inputs=inputs,
                dims={name: declared[name] for name in sorted(used)},
                auto_dims=auto,
                mode=pick("mode"),
                graphs=pick("graphs"),
                passes=chains.get(("models", i, "passes") if m.passes is not None else ("defaults", "passes"), []),
                save_inputs=pick("save_inputs"),
                save_values=pick("save_values"),
                verify=pick("verify"),
                loss=pick("loss"),
                optimizer=pick("optimizer"),
                seed=f.seed,
                trusted_ops=f.trusted_ops,
                resources=m.resources,
                forward_args=m.forward_args or {},
                device=m.device if m.device != "cpu" else None,
                distributed=m.distributed,
            )
        )
    return Pipeline(name=f.name, path=path, output=f.output, seed=f.seed, executor=f.executor, models=models,
                    source_lines=source_lines)


def _resolved_input(entry: InputEntry, declared: dict[str, DimSpec]) -> InputSpec:
    """An input as the spec holds it: its shape at the example sizes, its named dimensions in `dims`."""
    fields = {f: getattr(entry, f) for f in type(entry).model_fields if f != "shape"}
    names = [d if isinstance(d, str) else None for d in entry.shape]
    shape = [declared[d].size if isinstance(d, str) else d for d in entry.shape]
    return InputSpec(**fields, shape=shape, dims=names if any(names) else [])


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the pipeline YAML, for editors."""
    schema = PipelineFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "aotpipe pipeline (schema version 1)"
    return schema
