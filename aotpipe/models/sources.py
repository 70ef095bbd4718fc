"""Model sources: build the nn.Module and its example inputs from a ModelSpec.

Five forms of `source:`
- ``module:callable``: import `module`, call `callable(**args)`, which returns an nn.Module;
- ``aotpipe.zoo:<name>``: a builtin model, looked up by name in :data:`aotpipe.models.zoo.ZOO`
  (never resolved as an attribute path);
- ``hf:<ClassName>``: a transformers class built from ``config:`` with random weights
  (no hub access);
- ``pt2:<path>``: the module of a torch.export archive (torch.export.load; the path is
  relative to the pipeline file), with the weights it holds;
- ``torch-op:<name>`` and ``torch-module:<name>``: an entry of torch's own op or module test
  database and one of its samples, which also supplies the example inputs
  (:mod:`aotpipe.models.torch_corpus`).

A pipeline file is the user's own, so its sources are built as written. A source named in
an artefact's manifest is another matter: rebuilding it (for eager comparisons) runs code
the artefact chose, so :func:`rebuild_refusal` allows only builtin zoo models unless the
caller trusts the artefact.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from pathlib import Path
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree
from pydantic_core import ErrorDetails

from aotpipe.errors import AotpipeError, LimitError, SourceError, exception_line
from aotpipe.format.limits import bounded_build, check_rebuild_args, check_total_bytes, numel
from aotpipe.format.records import ModelRecord
from aotpipe.models import inputs_data, torch_corpus
from aotpipe.models.pt2 import pt2_problem
from aotpipe.models.pt2_source import load_pt2_module
from aotpipe.models.zoo import ZOO
from aotpipe.runtime.determinism import derived_seed  # noqa: F401 (re-exported: the seed of a model's weights and inputs)
from aotpipe.runtime.global_state import preserved
from aotpipe.spec import ZOO_PREFIX, InputSpec, ModelSpec, source_import_path


def _resolve_builtin(source: str) -> Any:
    name = source[len(ZOO_PREFIX):]
    fn = ZOO.get(name)  # a table lookup: the name is never an attribute path
    if fn is None:
        raise SourceError(f"{source!r}: aotpipe's zoo has no model {name!r}; it has: {', '.join(sorted(ZOO))}")
    return fn


def is_builtin(source: Any) -> bool:
    """Whether `source` names a model of a fixed table: the builtin zoo's, or torch's own op
    and module test databases (an entry's name is looked up, never resolved as a path)."""
    if torch_corpus.is_corpus_source(source):
        return True
    return isinstance(source, str) and source.startswith(ZOO_PREFIX) and source[len(ZOO_PREFIX):] in ZOO


def _resolve_callable(source: str, base_dir: Path | None) -> Any:
    if source.startswith(ZOO_PREFIX):
        return _resolve_builtin(source)
    module_name, _, attr = source.partition(":")
    with source_import_path(base_dir):
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise SourceError(
                f"cannot import module {module_name!r} ({e}); check the module path, or install it"
            ) from None
        except Exception as e:  # the user's module raised while importing
            raise SourceError(f"importing {module_name!r} raised {exception_line(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            hint = f"; it has: {', '.join(names[:20])}" if names else ""
            raise SourceError(f"module {module_name!r} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SourceError(f"{source!r} is not callable; point at a function or class returning an nn.Module")
    return obj


resolve_callable = _resolve_callable  # what an input's data: function is imported by (inputs_data)


def _resolve_hf(source: str) -> Any:
    cls_name = source[3:]
    try:
        import transformers
    except ImportError:
        raise SourceError(
            f"{source!r} needs transformers; install the extra: pip install 'aotpipe[hf]' -c constraints.txt"
        ) from None
    cls = getattr(transformers, cls_name, None)
    if cls is None or not inspect.isclass(cls) or not hasattr(cls, "config_class"):
        raise SourceError(
            f"transformers has no model class {cls_name!r}; use a class such as BertModel or LlamaForCausalLM"
        )
    return cls


def config_fields(config_class: Any) -> Optional[set[str]]:
    """The keys a transformers config class takes: its __init__'s named parameters, the
    attributes a default instance holds, its attribute_map's aliases and its settable
    properties (``_attn_implementation`` as ``attn_implementation``, ``num_labels``); None
    when they cannot be told (a class with no default instance that takes **kwargs). A
    config class keeps any other keyword as a plain attribute, which its model never reads."""
    try:
        params = inspect.signature(config_class.__init__).parameters
    except (TypeError, ValueError):
        return None
    known = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    try:
        known |= set(vars(config_class()))
    except Exception:  # a config class that needs arguments: its signature alone
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return None
    known |= set(getattr(config_class, "attribute_map", None) or {})
    known |= {n for c in config_class.__mro__ for n, v in vars(c).items() if isinstance(v, property) and v.fset}
    return {n.lstrip("_").removesuffix("_internal") for n in known} | known


def config_key_problems(source: str, config: Optional[dict[str, Any]]) -> list[tuple[str, str]]:
    """(key, message) for each key of an hf: source's `config:` that its config class does not
    take, naming the nearest one it does (transformers would keep a typo as an attribute the
    model never reads, and build the default-size model)."""
    if not config or not source.startswith("hf:"):
        return []
    cls = _resolve_hf(source)
    known = config_fields(cls.config_class)
    if known is None:
        return []
    out = []
    for key in config:
        if key not in known:
            near = difflib.get_close_matches(str(key), sorted(k for k in known if not k.startswith("_")), n=1)
            fix = f"did you mean {near[0]}?" if near else "see the class's documentation for its fields"
            out.append((str(key), f"{cls.config_class.__name__} (the config of {source[3:]}) has no field {key!r}; "
                                  f"{fix}"))
    return out


def check_source(source: str, base_dir: Path | None = None) -> str | None:
    """None if the source resolves, else a message saying what is wrong and how to fix it."""
    try:
        if source.startswith("hf:"):
            _resolve_hf(source)
        elif torch_corpus.is_corpus_source(source):
            return torch_corpus.source_problem(source)
        elif source.startswith("pt2:"):
            return pt2_problem(source, base_dir)
        else:
            _resolve_callable(source, base_dir)
    except SourceError as e:
        return str(e)
    return None



def build_model(spec: ModelSpec, base_dir: Path | None = None) -> torch.nn.Module:
    """Build the model with weights from a seed derived from the pipeline seed and its name."""
    torch.manual_seed(derived_seed(spec.seed, spec.name, "weights"))
    if spec.source.startswith("pt2:"):
        model = load_pt2_module(spec.source, base_dir)
    elif torch_corpus.is_corpus_source(spec.source):
        model = torch_corpus.build_model(spec)
    elif spec.source.startswith("hf:"):
        cls = _resolve_hf(spec.source)
        wrong = config_key_problems(spec.source, spec.config)
        if wrong:
            raise SourceError(f"config: {wrong[0][1]}")
        try:
            config = cls.config_class(**(spec.config or {}))
            model = cls(config)
        except LimitError:  # a rebuild over the limits (format/limits.py: bounded_build)
            raise
        except Exception as e:
            raise SourceError(f"building {spec.source} from its config failed: {exception_line(e)}; fix config") from e
    else:
        fn = _resolve_callable(spec.source, base_dir)
        try:
            model = fn(**spec.args)
        except TypeError as e:
            raise SourceError(f"calling {spec.source}(**args) failed: {e}; check args") from e
    if not isinstance(model, torch.nn.Module):
        raise SourceError(f"{spec.source} returned {type(model).__name__}, not a torch.nn.Module")
    if inputs_data.is_structured(spec):  # nested inputs or forward_args: the graphs take flat tensors
        model = inputs_data.StructuredCall(model, spec)
    return model


def make_input(spec: InputSpec, generator: torch.Generator) -> torch.Tensor:
    """One example input tensor, drawn from `generator`."""
    dtype = getattr(torch, spec.dtype)
    shape = tuple(spec.shape)
    if spec.dtype == "bool":
        return torch.randint(0, 2, shape, generator=generator).bool()
    if spec.is_integer:
        low = int(spec.low) if spec.low is not None else 0
        high = int(spec.high) if spec.high is not None else 2
        return torch.randint(low, high, shape, generator=generator, dtype=torch.int64).to(dtype)
    if spec.low is not None or spec.high is not None:
        low = float(spec.low if spec.low is not None else 0.0)
        high = float(spec.high if spec.high is not None else 1.0)
        t = (torch.rand(shape, generator=generator, dtype=torch.float32) * (high - low) + low).to(dtype)
    else:
        t = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
    return t.requires_grad_(spec.requires_grad)


def make_example_inputs(spec: ModelSpec, base_dir: Path | None = None
                        ) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """Positional and keyword example inputs, the same for the same seed on any machine: made
    from `inputs:` (loaded where an input names its `data:`, relative to `base_dir`), or a
    torch-op/torch-module source's own sample. A structured spec's (inputs_data.is_structured)
    are all positional, in the order of `inputs:`."""
    if torch_corpus.is_corpus_source(spec.source):
        return torch_corpus.example_inputs(spec)
    g = torch.Generator().manual_seed(derived_seed(spec.seed, spec.name, "inputs"))
    if inputs_data.is_structured(spec):
        return tuple(inputs_data.load_input_tensor(inp, base_dir, f"model {spec.name!r} input {inp.name or j}",
                                          _resolve_callable)
                     if inp.data is not None else make_input(inp, g) for j, inp in enumerate(spec.inputs)), {}
    args, kwargs = [], {}
    for j, inp in enumerate(spec.inputs):
        t = make_input(inp, g) if inp.data is None else \
            inputs_data.load_input_tensor(inp, base_dir, f"model {spec.name!r} input {inp.name or j}",
                                          _resolve_callable)
        if inp.name is None:
            if kwargs:
                raise SourceError(f"model {spec.name!r}: positional inputs must come before named ones")
            args.append(t)
        else:
            kwargs[inp.name] = t
    return tuple(args), kwargs


def user_input_names(args: tuple, kwargs: dict, names: list[str]) -> list[str]:
    """Names of the flattened (args, kwargs) leaves, in pytree order: positional ones by `names`
    (the spec's input names, ``arg{i}`` for an unnamed one), keyword ones by their key. What
    a graph's user inputs are called (inputs.json `target`), at capture and at replay."""
    by_id = {}
    leaves_args = list(args)
    for i, t in enumerate(leaves_args):
        by_id[id(t)] = names[i] if i < len(names) else f"arg{i}"
    for k, t in kwargs.items():
        by_id[id(t)] = k
    return [by_id.get(id(t), f"input{i}") for i, t in enumerate(pytree.tree_leaves((args, kwargs)))]


# ---------------------------------------------------------------------------------------
# rebuilding the model an artefact came from


def rebuild_refusal(source: Any, trust_code: bool) -> str | None:
    """Why the model an artefact's manifest names may not be rebuilt; None if it may.

    The one decision for every command and API that rebuilds a model from a manifest
    (replay --chain and --bench, replay_chain, eager_bench). A builtin zoo model is
    looked up in a fixed table; anything else (``module:callable``, ``hf:``) imports and
    calls what the manifest names, so it needs the caller's trust.
    """
    if is_builtin(source) or trust_code:
        return None
    return (f"the manifest's source {str(source)[:80]!r} is not a builtin zoo model; rebuilding it would run "
            "code the artefact names: pass --trust-code (trust_code=True) if you trust this artefact")


def _spec_bytes(spec: ModelSpec) -> list[tuple[str, int]]:
    """(label, bytes) of each example input a spec asks for."""
    out = []
    for i, inp in enumerate(spec.inputs):
        n = numel(inp.shape) * getattr(torch, inp.dtype).itemsize
        out.append((f"input {inp.name or i}: {inp.dtype}{list(inp.shape)}", n))
    return out


def build_within_limits(spec: ModelSpec, where: Any) -> tuple[torch.nn.Module, tuple, dict]:
    """The model and its example inputs, refused before allocating when their parameters,
    buffers and inputs need more than the byte limit (the model is first built on the
    meta device, which allocates nothing)."""
    parts = _spec_bytes(spec)
    check_total_bytes(parts, where, f"the example inputs of model {spec.name!r}")
    with preserved():
        try:
            with torch.device("meta"):
                meta = build_model(spec)
        except LimitError:
            raise
        except Exception:
            meta = None  # a model that cannot be built on meta is sized by its real build
        if meta is not None:
            for name, t in list(meta.named_parameters()) + list(meta.named_buffers()):
                parts.append((f"{name}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)}",
                              t.numel() * t.element_size()))
            del meta
            check_total_bytes(parts, where, f"model {spec.name!r} ({spec.source}) and its example inputs")
        try:
            model = build_model(spec)
            args, kwargs = make_example_inputs(spec)
        except RuntimeError as e:  # an allocation the meta build could not foresee
            raise LimitError(f"{where}: building model {spec.name!r} failed: {str(e).strip().splitlines()[0]}") from None
    return model, args, kwargs


def rebuild_from_manifest(model_record: ModelRecord, *, trust_code: bool, where: Any) -> tuple | None:
    """(model, args, kwargs) rebuilt from a manifest's model record, or None when it may not
    be rebuilt (see rebuild_refusal) or cannot be; a LimitError when it would need more
    memory than the limits allow."""
    if rebuild_refusal(model_record.source, trust_code) is not None \
            or inputs_data.data_code_refusal(model_record.model_dump(), trust_code) is not None:
        return None
    try:
        # The pass chain plays no part in building the model; a manifest written before each
        # chain was stored once holds it here in its written form ({name, options}), which
        # may name a pass this aotpipe no longer has.
        spec = ModelSpec.model_validate({**model_record.model_dump(), "passes": []})
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return None
    if is_builtin(spec.source):
        check_rebuild_args(spec.args, where)
    try:
        with bounded_build(where):
            return build_within_limits(spec, where)
    except LimitError:
        raise
    except (AotpipeError, ValueError, TypeError, ImportError):
        return None


# ---------------------------------------------------------------------------------------
# what validate can tell from the built model, before any capture


def args_problem(spec: ModelSpec, base_dir: Path | None = None) -> tuple[str, str] | None:
    """(argument name, message) when `args:` names an argument the source's callable does not
    take, or leaves out one it needs; None when they fit (or the callable hides its signature)."""
    if spec.source.startswith(("hf:", "pt2:")):
        return None
    if torch_corpus.is_corpus_source(spec.source):
        return torch_corpus.args_problem(spec.args)
    try:
        fn = _resolve_callable(spec.source, base_dir)
        sig = inspect.signature(fn)
    except (SourceError, TypeError, ValueError):
        return None  # reported as a source problem, or a builtin without a signature
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    takes = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in spec.args:
        if name not in takes:
            return name, (f"{spec.source} takes no argument {name!r}; it takes: {', '.join(takes) or 'none'}")
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in spec.args]
    if missing:
        return "", f"{spec.source} needs argument(s) {', '.join(missing)}; add them under args"
    return _arg_type_problem(spec, fn)


def _arg_type_problem(spec: ModelSpec, fn: Any) -> tuple[str, str] | None:
    """(argument name, message) for the first of `args:` whose value does not fit the type the
    callable annotates it with (a quoted "64" for an int): checked by pydantic, lax as Python
    calls are (a YAML list for a tuple, an int for a float), except that a string or a
    fractional float is never taken for a number. Unannotated arguments, and annotations
    pydantic cannot check (a class of the model's own), are not checked."""
    from pydantic import TypeAdapter, ValidationError

    try:
        hints = typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else fn)
    except Exception:  # an annotation that does not resolve: nothing to check against
        return None
    for name, value in spec.args.items():
        ann = hints.get(name)
        if ann is None or ann is Any:
            continue
        try:
            adapter = TypeAdapter(ann)
        except Exception:  # pydantic has no schema for it
            continue
        try:
            adapter.validate_python(value)
        except ValidationError:
            pass  # fits not even as Python would pass it
        else:
            try:
                adapter.validate_python(value, strict=True)
                continue
            except ValidationError as e:
                errors: list[ErrorDetails] = e.errors()
                if not any(isinstance(x["input"], str) or isinstance(x["input"], float) and x["type"] == "int_type"
                           for x in errors):
                    continue  # a list for a tuple: the callable gets what Python code would pass
        shown = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
        hint = " (write it without quotes)" if isinstance(value, str) else ""
        return name, (f"{value!r} is a {type(value).__name__}, but {spec.source} takes {shown} for {name}; "
                      f"give a value of that type{hint}")
    return None


def meta_build(spec: ModelSpec, base_dir: Path | None = None) -> tuple[Optional[torch.nn.Module], Optional[str]]:
    """The model built on the meta device (nothing allocated), and for an hf: source why it
    cannot be built from its `config:` (heads that do not divide the hidden size: transformers
    checks it as it builds the attention layers). (None, None) where the build fails only for
    want of real values (a constructor that reads a tensor's data, an op with no meta kernel),
    or for a module:callable, which may import optional packages as it builds (a pipeline's
    models need not all be installable here): capture builds it for real and says why."""
    with preserved():
        try:
            with torch.device("meta"):
                return build_model(spec, base_dir), None
        except Exception as e:
            if not spec.source.startswith("hf:") or isinstance(e, NotImplementedError):
                return None, None
            line = str(e) if isinstance(e, SourceError) else exception_line(e)
            if "meta" in line.lower():
                return None, None
            return None, line if isinstance(e, SourceError) else f"building {spec.source} failed: {line}; fix config"


def embedding_range_problems(spec: ModelSpec, base_dir: Path | None = None,
                             model: Optional[torch.nn.Module] = None) -> list[tuple[int, str]]:
    """(input index, message) for each integer input whose range does not fit an embedding
    table it indexes: its `high` (exclusive) above the table's row count.

    The model (`model`, or else built here) is built on the meta device (no memory) and run on meta inputs with a hook on
    each nn.Embedding that sees which example input (or a view of it) it is given. A model
    that cannot be built or run so is not checked here (capture reports its own failure).
    """
    integer = {i: inp for i, inp in enumerate(spec.inputs) if inp.is_integer and inp.high is not None}
    if not integer:
        return []
    seen: dict[int, tuple[str, int]] = {}  # input index -> (embedding, rows) of the smallest table
    with preserved():
        try:
            if model is None:
                with torch.device("meta"):
                    model = build_model(spec, base_dir)
            tensors = [torch.empty(inp.shape, dtype=getattr(torch, inp.dtype), device="meta") for inp in spec.inputs]
        except Exception:
            return []
        index_of = {id(t): i for i, t in enumerate(tensors) if i in integer}
        hooks = []

        def hook(name: str, module: torch.nn.Module):
            def record(_m: torch.nn.Module, args: tuple) -> None:
                t = args[0] if args else None
                while isinstance(t, torch.Tensor) and id(t) not in index_of and t._base is not None:
                    t = t._base
                if isinstance(t, torch.Tensor) and id(t) in index_of:
                    i = index_of[id(t)]
                    if i not in seen or module.num_embeddings < seen[i][1]:
                        seen[i] = (name, module.num_embeddings)
            return record

        for name, m in model.named_modules():
            # A subclass with its own forward may use its input otherwise (transformers' learned
            # positional embeddings take input_ids for their shape only): only tables that index.
            if type(m).forward in (torch.nn.Embedding.forward, torch.nn.EmbeddingBag.forward):
                hooks.append(m.register_forward_pre_hook(hook(name, m)))
        if not hooks:
            return []
        args = [t for t, inp in zip(tensors, spec.inputs) if inp.name is None]
        kwargs = {inp.name: t for t, inp in zip(tensors, spec.inputs) if inp.name is not None}
        if inputs_data.is_structured(spec):  # the model built is a StructuredCall: all positional
            args, kwargs = tensors, {}
        try:
            with torch.no_grad():
                model.eval()(*args, **kwargs)
        except Exception:
            pass  # the hooks saw what ran before the failure
        finally:
            for h in hooks:
                h.remove()
    out = []
    for i, (name, rows) in sorted(seen.items()):
        high = int(integer[i].high)
        if high > rows:
            out.append((i, f"high: {high} does not fit embedding {name!r}, which has {rows} rows (indices must lie "
                           f"in [0, {rows})); set high: {rows} or less"))
    return out
