"""The artefact format: file names, version constants, and a strict typed model of every record.

One module says what an artefact folder holds. Every JSON record aotpipe writes
(manifest.json, and per graph inputs.json, trace.json, graph.json) is checked against these
models when it is written and when it is loaded: an unknown key, a value of the wrong type
or a number out of range is a one-line :class:`~aotpipe.errors.ArtifactError` naming the
file and the field, before anything is built from it. ``aotpipe schema --artifact`` prints
their JSON Schema, which is the format's specification.

Layout of a model folder::

    <model>/manifest.json            Manifest (sealed; signature.json beside it when signed)
    <model>/blobs/<sha256>.safetensors   one tensor each, named by the hash of its content
    <model>/<model>_<kind>_<i>/      one folder per graph kind of each subgraph i (0 but for
                                     dynamo, whose graph breaks give several; manifest key
                                     "<kind>" for i = 0, "<kind>_<i>" after)
        graph.json                   GraphRecord: the graph as data, rebuilt without running code
        inputs.json                  InputsRecord: inputs, storages, reference outputs
        trace.json                   TraceRecord: a sampled summary of every node's value
        module.py                    the graph as readable code (never imported unless trusted)
        <folder>.input               input metadata, torch's get_inputs format (restricted pickle)
    <model>/<model>_<kind>_<i>.<passes>/  the same graph after a pass chain

Version 1 records (aotpipe 0.1 before real-size artefacts) still validate; what differs is
marked "version 1" below.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, NamedTuple, TypeAlias, TypeVar, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    StringConstraints,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails
from typing_extensions import TypeAliasType

from aotpipe.errors import ArtifactError
from aotpipe.format.graph_keys import BASE_KEY_PATTERN
from aotpipe.format.limits import check_graphs, read_json
from aotpipe.format.vocabulary import GraphKind, KindField, StatusField

# ---------------------------------------------------------------------------------------
# Constants
#
# Each set of values a field may take is a Literal, and its tuple is read from it: a type
# checker reads the Literal, pydantic validates by it, and the code tests membership in the tuple.

FORMAT_VERSION: Final = 4
# Version 3 records the capture's environment and the evidence replay judges other machines by.
# Version 4: shape-polymorphic graphs (symbolic sizes beside the example's, the manifest's dims).
ReadableVersion = Literal[1, 2, 3, 4]
READABLE_VERSIONS: tuple[int, ...] = get_args(ReadableVersion)
# graph.json's own version: 2 lets a get_attr be "recompute" (its blob is not stored); 3 records
# the symbols of a shape-polymorphic graph (their ranges, sources and guards).
GRAPH_FORMAT_VERSION = 3
READABLE_GRAPH_VERSIONS = (1, 2, 3)

MANIFEST = "manifest.json"
SIGNATURE = "signature.json"
GRAPH_JSON = "graph.json"
INPUTS_JSON = "inputs.json"
TRACE = "trace.json"
RUN_JSON = "run.json"  # beside the model folders: one pipeline run (RunRecord)
MODULE_PY = "module.py"
BLOB_DIR = "blobs"
INPUT_SUFFIX = ".input"

# "state": a train_step's optimizer state (its target "<parameter>:<key>", e.g. "fc.weight:exp_avg")
# "lr": a train_step's learning rate, a scheduler's value for the step (replay feeds each chained
# step the schedule's: replay/steps.py)
InputRole = Literal["param", "buffer", "constant", "user", "tangent", "saved", "symint", "state", "lr"]
INPUT_ROLES: tuple[str, ...] = get_args(InputRole)
# A train_step's: "param", a parameter's new value; "state", an optimizer state's (targets as its inputs')
OutputRole = Literal["user", "mutation", "saved", "grad", "none", "param", "state"]
OUTPUT_ROLES: tuple[str, ...] = get_args(OutputRole)
# Where a replay takes an input's value from: a stored blob, ones (a tangent), the loss
# weights of its shape (a tangent, tensors.loss_weights; version 3), or the forward graph's
# outputs (a backward's saved activations).
InputSource = Literal["blob", "ones", "weights", "forward"]
INPUT_SOURCES: tuple[str, ...] = get_args(InputSource)
ValuesMode = Literal["full", "minimal", "none"]
VALUES_MODES: tuple[str, ...] = get_args(ValuesMode)

MAX_DIMS = 64  # torch's own limit on tensor dimensions


# The dtypes a record may name: torch's dense numeric ones (not quantized, not bit-packed or
# sub-byte shells). Written out, not read from torch: reading a manifest needs no torch import
# (a warm re-run that only checks what is up to date must not pay for one).
DType = Literal[
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
]
DTYPES: tuple[str, ...] = get_args(DType)

# ---------------------------------------------------------------------------------------
# Field types

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Device = Annotated[str, StringConstraints(pattern=r"^(cpu|cuda|meta|mps|xpu|hpu)(:[0-9]{1,4})?$")]
Count = Annotated[int, Field(ge=0)]
Shape = Annotated[list[Count], Field(max_length=MAX_DIMS)]
Stride = Annotated[list[Count], Field(max_length=MAX_DIMS)]
Range = Annotated[list[int], Field(min_length=2, max_length=2)]
# A size in terms of a graph's symbols, as torch prints it (``s0``, ``4*s0*s1``, ``s1 + 1``,
# ``Max(1, s0)``): read by format/symbolic.py's own parser, never by eval or sympy's.
SymExpr = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_+\-*/%(), ]+$", max_length=512)]
SymShape = Annotated[list[Count | SymExpr], Field(max_length=MAX_DIMS)]
SymbolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)]
# A captured graph's key: its kind, then "_<i>" for subgraph i > 0 of a dynamo capture.
BaseGraphKey = Annotated[str, StringConstraints(pattern=BASE_KEY_PATTERN)]
# A graph folder's name: no path separator, not hidden.
FolderName = Annotated[str, StringConstraints(pattern=r"^[^/\\.][^/\\]*$", max_length=255)]
Number = float | None  # a float, or null where no number applies


# Data as parsed from a JSON file or the pipeline YAML, before a record (or the pipeline
# file's model, config.PipelineFile) validates it. It is read by key only where it must be:
# a format version or a size peeked at before validating, and the YAML parser's own checks,
# which report every problem at once with its line (tools/record_lookups.py counts lookups
# on records, and apart those on values typed so).
RawJson: TypeAlias = Any
RawYaml: TypeAlias = Any

# On the long collections of a record: validation stops at the first bad element (pydantic
# would otherwise build an error for every one: gigabytes for a manifest of a million).
FailFast = Field(fail_fast=True)


class Record(BaseModel):
    """Strict: unknown keys are refused, and nothing is coerced ("1" is not 1, true is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# ---------------------------------------------------------------------------------------
# Shared pieces


class Summary(Record):
    """A small fingerprint of a tensor: layout, and float64 sums of its finite elements
    (over a strided sample of about 4096 elements in trace.json)."""

    shape: Shape
    stride: Stride
    dtype: DType
    sum: float
    abs_sum: float
    nonfinite: Count


class TupleSummary(Record):
    """A node whose value is a tuple: one summary per element (null for non-tensors)."""

    items: Annotated[list[Summary | None], FailFast]


class Partition(Record):
    """How a forward graph and its backward fit together (forward and backward records).

    forward(*primals) returns ``mutated inputs' new values + user outputs + saved``;
    backward(*saved, *tangents) returns one gradient (or None) per primal."""

    num_user_outputs: Count
    num_mutated_inputs: Count
    num_saved_tensors: Count
    num_saved_symints: Count
    num_tangents: Count
    mutated_inputs: list[str]  # forward input names, in output order
    grad_of: list[str | None]  # per backward output: the forward input it is the grad of

    @property
    def num_forward_outputs(self) -> int:
        """Forward outputs that are not saved activations (mutations + user outputs)."""
        return self.num_mutated_inputs + self.num_user_outputs


# ---------------------------------------------------------------------------------------
# inputs.json


class StorageRecord(Record):
    """One storage the inputs are views of; `blob` holds its elements when stored."""

    dtype: DType
    device: Device
    numel: Count
    range: Range | None = None  # [low, high) of integer values, to regenerate valid ones
    blob: Sha256 | None = None


class Layout(Record):
    """A tensor's layout as recorded at capture (absent for scalars and None outputs)."""

    shape: Shape | None = None
    stride: Stride | None = None
    storage_offset: Count | None = None
    dtype: DType | None = None
    device: Device | None = None
    requires_grad: bool | None = None
    # A shape-polymorphic graph's (version 4): the shape and stride in its symbols; shape and
    # stride above are their values at the example sizes.
    sym_shape: SymShape | None = None
    sym_stride: SymShape | None = None

    @model_validator(mode="after")
    def _stride_per_dimension(self) -> Layout:
        if self.shape is not None and self.stride is not None and len(self.shape) != len(self.stride):
            raise ValueError(f"shape {self.shape} and stride {self.stride} differ in length")
        for name, sym, plain in (("sym_shape", self.sym_shape, self.shape), ("sym_stride", self.sym_stride, self.stride)):
            if sym is not None and (plain is None or len(sym) != len(plain)):
                raise ValueError(f"{name} {sym} does not match {name.removeprefix('sym_')} {plain} in length")
        return self


class InputRecord(Layout):
    """One graph input (placeholder): a tensor view of a storage, or a Python scalar."""

    index: Count
    name: str
    role: InputRole
    target: str | None = None
    source: InputSource = "blob"  # version 1: always blob
    type: Literal["tensor", "int", "float", "bool"]
    value: bool | int | float | None = None  # scalars
    range: Range | None = None
    storage: Count | None = None  # index into storages
    forward_output: Count | None = None  # source "forward": which forward output it is
    sym_value: SymExpr | None = None  # a size input of a shape-polymorphic graph: its value in the symbols


class Evidence(Record):
    """What a replay where bits cannot match (another CPU, torch, thread count or device) is
    judged by (version 3): a deterministic sample of the output's values, statistics of those
    same elements, and the element-wise bound a replay's values may depart from them by.

    The sample is `count` elements (all of them, or :data:`aotpipe.runtime.evidence.SAMPLE`), element
    j at row-major flat index ``j * numel // count``; `blob` holds them as a 1-D tensor of
    the output's dtype. `bound` is None for integer and bool outputs, which must be equal."""

    blob: Sha256
    count: Count
    sum: float  # float64 sums over the sampled elements that are finite
    abs_sum: float
    max_abs: float
    nonfinite: Count
    bound: float | None = Field(default=None, ge=0)
    # How the bound was derived: "fp64" from eager float32's measured error against float64
    # (eager_error, an RMS), "floor" from the float-noise floor of the tensor's RMS (rms).
    bound_from: Literal["fp64", "floor"] | None = None
    eager_error: float | None = Field(default=None, ge=0)
    rms: float | None = Field(default=None, ge=0)  # RMS of the whole output's finite elements


class OutputRecord(Layout):
    """One graph output and its reference: a digest and summary, or a stored value."""

    index: Count
    role: OutputRole
    target: str | None = None
    same_as: Count | None = None  # a de-duplicated output: the earlier output it is
    same_as_input: Count | None = None  # the output is this input, returned as is
    blob: Sha256 | None = None
    digest: Sha256 | None = None  # sha256 of dtype, shape and bytes (version 2)
    summary: Summary | None = None
    spread: float | None = Field(default=None, ge=0)  # run-to-run spread of a nondeterministic op
    evidence: Evidence | None = None  # version 3
    # version 3: a Python int, float or bool output's value (a size the graph computed from
    # tensor values, e.g. how many tokens a router sent to an expert), compared exactly.
    value: bool | int | float | None = None
    # version 3: an integer tensor output's values lie in [low, high) (indices a forward saves
    # for its backward: random inputs for the backward are drawn there).
    range: Range | None = None


class InputsRecord(Record):
    """inputs.json: what a graph takes and gives, and where replay gets the values."""

    format_version: ReadableVersion
    kind: KindField
    groups: list[Count] | None = None  # input group sizes (params, buffers, user inputs...)
    rng_seed: int | None = None  # the seed random ops draw from (version 2)
    values: ValuesMode | None = None  # what is stored (version 2)
    saved_values: bool | None = None  # version 1: every value stored
    storages: Annotated[list[StorageRecord], FailFast]
    inputs: Annotated[list[InputRecord], FailFast]
    outputs: Annotated[list[OutputRecord], FailFast]
    partition: Partition | None = None
    passes: list[str] | None = None  # a graph made by passes: the chain, in order

    @property
    def values_mode(self) -> str:
        """"full" (every value), "minimal" (what cannot be recomputed) or "none"."""
        if self.values is not None:
            return self.values
        return "full" if self.saved_values else "none"


# ---------------------------------------------------------------------------------------
# trace.json


class TraceRecord(Record):
    """trace.json: per node name, a summary of its value when the graph ran at write time."""

    format_version: ReadableVersion
    sampled: bool = False  # summaries over strided samples (version 2)
    nodes: Annotated[dict[str, Summary | TupleSummary | None], FailFast]


# ---------------------------------------------------------------------------------------
# graph.json


class NodeOrigin(Record):
    """Where a node came from (absent in files written before aotpipe recorded it): the
    innermost module it was called in (its path from the model, "" for the model itself,
    and its class), and the source line that called the op, relative to its package
    (``aotpipe/models/zoo.py:94``; never an absolute path). `of_forward`: a backward node's module
    is that of the forward node it computes the gradient of."""

    module: Annotated[str, StringConstraints(max_length=1024)] | None = None
    module_class: Annotated[str, StringConstraints(max_length=512)] | None = None
    source: Annotated[str, StringConstraints(max_length=1024)] | None = None
    of_forward: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)  # shared by the nodes of one origin


# A node argument: JSON's own values, a list, or one of the tagged forms below (an object
# with one key) for what JSON lacks. The key says which (a pydantic discriminated union).


class NodeRef(Record):
    """An earlier node's value."""

    node: str


class TupleArg(Record):
    tuple: list[NodeArg]


class DTypeArg(Record):
    dtype: DType


class DeviceArg(Record):
    device: str  # torch.device's spelling, checked when the graph is built


class LayoutArg(Record):
    layout: str  # only "strided" builds (graph_json refuses the rest, naming it)


class MemoryFormatArg(Record):
    memory_format: str


class SliceArg(Record):
    slice: Annotated[list[NodeArg], Field(min_length=3, max_length=3)]  # start, stop, step


class ComplexArg(Record):
    complex: Annotated[list[NodeArg], Field(min_length=2, max_length=2)]  # real, imaginary


class FloatArg(Record):
    float: Literal["nan", "inf", "-inf"]  # the floats JSON cannot spell


ARG_TAGS: dict[str, type[Record]] = {
    "node": NodeRef, "tuple": TupleArg, "dtype": DTypeArg, "device": DeviceArg, "layout": LayoutArg,
    "memory_format": MemoryFormatArg, "slice": SliceArg, "complex": ComplexArg, "float": FloatArg,
}


def _arg_tag(v: Any) -> str | None:
    """Which member of NodeArg `v` is: the JSON type, or a tagged object's one key."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return next(iter(v)) if len(v) == 1 and next(iter(v)) in ARG_TAGS else None
    for tag, cls in ARG_TAGS.items():
        if isinstance(v, cls):
            return tag
    return None


_NodeArgMembers: TypeAlias = (
    Annotated[None, Tag("null")]
    | Annotated[bool, Tag("bool")]
    | Annotated[int, Tag("int")]
    | Annotated[float, Tag("number")]
    | Annotated[str, Tag("str")]
    | Annotated[list["NodeArg"], Tag("list")]
    | Annotated[NodeRef, Tag("node")]
    | Annotated[TupleArg, Tag("tuple")]
    | Annotated[DTypeArg, Tag("dtype")]
    | Annotated[DeviceArg, Tag("device")]
    | Annotated[LayoutArg, Tag("layout")]
    | Annotated[MemoryFormatArg, Tag("memory_format")]
    | Annotated[SliceArg, Tag("slice")]
    | Annotated[ComplexArg, Tag("complex")]
    | Annotated[FloatArg, Tag("float")]
)
if TYPE_CHECKING:
    # mypy cannot follow a recursive TypeAliasType ("possible cyclic definition") but follows
    # a recursive plain alias: it reads the same union, without pydantic's discriminator.
    NodeArg: TypeAlias = _NodeArgMembers
else:
    # pydantic needs the named alias to validate (and print the schema of) a recursive type.
    NodeArg = TypeAliasType("NodeArg", Annotated[
        _NodeArgMembers,
        Discriminator(_arg_tag, custom_error_type="node_argument",
                      custom_error_message="not a node argument: a JSON value, a list, or an object with one of "
                                           "the keys " + ", ".join(ARG_TAGS)),
    ])
for _cls in (TupleArg, SliceArg, ComplexArg):
    _cls.model_rebuild()


class NodeRecord(Record):
    """One FX node. `args` and `kwargs` are node arguments (NodeArg): JSON values, lists, and
    tagged objects of one key for what JSON lacks ({"node": name} refers to an earlier node,
    {"tuple": [...]}, {"dtype": "float32"}, {"device": "cpu"}, {"layout": "strided"},
    {"memory_format": ...}, {"slice": [start, stop, step]}, {"complex": [re, im]},
    {"float": "nan" | "inf" | "-inf"}). A call_function target is a qualified op name
    (aten.addmm.default) that must be on the allow-list of safe ops."""

    name: str
    op: Literal["placeholder", "get_attr", "call_function", "output"]
    target: str | None = None
    args: list[NodeArg] | None = None
    kwargs: dict[str, NodeArg] | None = None
    val: JsonValue = None  # the value's layout at capture (informational)
    blob: Sha256 | None = None  # get_attr: the constant's blob
    shape: Shape | None = None  # get_attr: the constant's layout (blobs are contiguous)
    stride: Stride | None = None
    recompute: bool | None = None  # get_attr: not stored; the loader reruns the pass chain
    origin: NodeOrigin | None = None  # module path, class and source line (provenance)


class SymbolRecord(Record):
    """One symbol of a shape-polymorphic graph (graph.json, version 3): the sizes it may take
    (torch's range: `max` None when unbounded), its value at the example sizes, the named
    dimension it stands for (None: torch's own, e.g. `dims: auto`'s), and the input dimensions it
    was read from (``input_ids.size(0)``)."""

    dim: str | None = None
    min: Count
    max: Count | None = None
    example: Count
    sources: list[Annotated[str, StringConstraints(max_length=256)]] = []


class NodeValue(BaseModel):
    """A tensor node's `val` as graph.json writes it (informational, so read leniently: None
    where it is not one): its shape, in the graph's symbols where they are symbolic."""

    model_config = ConfigDict(extra="ignore", strict=True)

    shape: list[int | SymExpr]
    dtype: DType = "float32"

    @classmethod
    def of(cls, val: JsonValue) -> NodeValue | None:
        try:
            return cls.model_validate(val)
        except ValidationError:
            return None


class GraphRecord(Record):
    """graph.json: an FX graph as data."""

    format_version: Literal[1, 2, 3]
    kind: KindField | None = None
    input_groups: list[Count] | None = None
    nodes: Annotated[list[NodeRecord], FailFast]
    symbols: dict[SymbolName, SymbolRecord] | None = None  # version 3: a shape-polymorphic graph's
    # version 3: the guards torch derived on the symbols while tracing, as it prints them
    guards: list[Annotated[str, StringConstraints(max_length=1024)]] | None = None


# ---------------------------------------------------------------------------------------
# manifest.json


class PassRecord(Record):
    """One pass of a chain as it ran (passes.PassStep is the chain's step as the pipeline names it)."""

    name: str
    options: dict[str, JsonValue]
    nodes_before: Count
    nodes_after: Count
    modified: bool
    max_abs_error: Number = None  # version 1: the per-pass check's largest difference
    stats: dict[str, int | float]


class SkippedPass(Record):
    """A pass that failed and was left out of its chain (an optional pass: the chain went on
    without it, and the model is not failed for it)."""

    graph: str  # the key of the graph the chain ran on ("inference")
    name: str  # the pass
    error: str  # one line: why it failed
    left_out: list[str] = []  # later passes of the chain that need it, left out with it
    # The passes that ran, joined by '+' (the graph they made is "<graph>.<chain>"); None: none ran
    chain: str | None = None


class CheckItem(Record):
    """One comparison of a graph against eager (accuracy.py's rule)."""

    what: str
    passed: bool
    method: str
    error: Number = None
    eager_error: Number = None
    ratio: Number = None
    bound: Number = None
    detail: str | None = None


class CheckTotals(Record):
    run: Count
    passed: Count
    failed: Count
    skipped: Count
    indirect: Count = 0  # held through other graphs (e.g. joint = forward then backward)
    # version 3: how the run checks were settled (accuracy.compare's method; they add up to
    # `run`): compared exactly (integers, shapes, None), within the float-noise floor of
    # eager float32, or by the float64 rule; and of those, how many where eager float32 has
    # no correct digit (the value is zero in exact arithmetic), held to eager's own noise.
    exact: Count | None = None
    floor: Count | None = None
    fp64: Count | None = None
    within_noise: Count | None = None


class GraphChecks(CheckTotals):
    skipped_reasons: list[str] = []
    items: Annotated[list[CheckItem], FailFast] = []


class GraphEntry(Record):
    """manifest.json's record of one graph."""

    folder: FolderName
    nodes: Count
    inputs: Count
    outputs: Count
    ops: Count | None = None
    base: BaseGraphKey | None = None  # a graph made by passes: the key of the graph they ran on
    # A graph made by passes: the chain that made it, as it ran. The one copy of the chain
    # (Manifest.pass_chains reads it, and the copies older manifests kept).
    passes: list[PassRecord] | None = None
    checks: GraphChecks | None = None
    nondeterministic: list[str] = []  # ops without a deterministic kernel (values stored)
    eager: dict[str, JsonValue] | None = None  # version 1's eager comparison


class VerificationEntry(Record):
    """How a graph (or the forward-backward-joint chain, key "chain"; a train_step's chained
    steps, key "steps") checked at write time."""

    status: str
    inputs: str | None = None
    error: str | None = None
    first_divergence: JsonValue = None
    mismatches: list[JsonValue] | None = None
    compared: Count | None = None
    problems: list[JsonValue] | None = None
    # "steps" (a train_step's chained steps, `compared` of them): each output's digest after the last
    digests: list[Sha256 | None] | None = None
    # "ranks" (a distributed rank, version 4): each graph's outputs' digests as the ranks' run together
    # gave them, which `aotpipe replay --ranks` compares with
    graph_digests: dict[str, list[Sha256 | None]] | None = None


class Environment(Record):
    """Where the graphs ran when their reference outputs were recorded, and what else decides
    their bits (version 3; aotpipe.runtime.determinism.environment). A replay runs at `threads` unless
    told otherwise; where one of these differs, or `cpu` was not recorded, it judges outputs
    whose bits differ by their evidence."""

    device: str
    threads: Annotated[int, Field(ge=1)]  # intra-op threads (torch.get_num_threads)
    cpu_capability: str  # torch.backends.cpu.get_cpu_capability(): AVX512, AVX2, DEFAULT, ...
    torch: str
    deterministic_algorithms: bool
    fill_uninitialized_memory: bool
    float32_matmul_precision: str
    mkldnn: bool  # oneDNN available
    mkl: bool
    # determinism.cpu_model(): the CPU's vendor and family/model/stepping, then its feature
    # flags ("GenuineIntel 6/207/2 | avx avx2 ..."); a replay compares the model and the flags
    # MKL and oneDNN pick kernels by, which cpu_capability does not tell apart (two AVX512 CPUs
    # can give other bits). Absent in artefacts written before it was recorded.
    cpu: str | None = None
    # How the loader packs a CPU graph's weights when it builds it (artifact/prepack.py), so
    # how the recorded outputs were computed: "onednn" (oneDNN's GEMM with its unary epilogue
    # fused, residual convolutions in place). Absent (written before it was recorded): MKL's
    # packed GEMM, nothing fused at load, which the loader still packs such artefacts with.
    packing: str | None = None


class Versions(Record):
    aotpipe: str
    torch: str
    python: str


class GraphBreakRecord(Record):
    """Why dynamo ended a subgraph early, and where (file name and line, no directory)."""

    subgraph: Count
    reason: str
    where: str | None = None
    code: str | None = None


Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]

# Op namespaces whose ops the allow-list (artifact/ops.py) checks one by one: never trusted whole.
CHECKED_NAMESPACES = ("aten", "prims", "rngprims", "mkldnn", "mkl", "onednn", "_operator", "builtins", "math")


def library_namespace_problem(ns: Any) -> str | None:
    """Why `ns` cannot be trusted as a library's op namespace (trusted_ops, --trust-ops), or None."""
    if not isinstance(ns, str) or not ns.isidentifier() or ns.startswith("__") or len(ns) > 128:
        return f"{str(ns)[:60]!r} is not an op namespace (a Python identifier such as transformers)"
    if ns in CHECKED_NAMESPACES:
        return (f"aotpipe's allow-list decides which {ns!r} ops a graph may call, one by one "
                "(aotpipe/artifact/ops.py); only a library's namespace can be trusted")
    return None
ModulePath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,15}$",
                                              max_length=256)]
LibraryOp = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$",
                                             max_length=256)]


class TrustedNamespace(Record):
    """A library op namespace the pipeline trusted: the module that registers its ops (None
    if capture could not tell) and the ops the graphs call. A loader imports the module only
    with its user's trust, and only from the package of that name unless the user names it."""

    module: ModulePath | None = None
    ops: Annotated[list[LibraryOp], Field(max_length=10_000)]


class OutsideGraphs(Record):
    """What one compile of a dynamo capture (inference or training) ran outside its graphs,
    which makes the capture partial: its outputs depend on code no stored graph holds
    (capture/dynamo.py: outside_graphs; docs/capture-modes.md#partial-captures)."""

    compile: Literal["inference", "training"]
    # ATen ops the eager model ran that no subgraph ran ("aten._ctc_loss.Tensor": 1)
    ops: dict[str, Count]
    # Tensors no graph made that a subgraph took or the model returned ("model output 0")
    values: list[str] = []

    def text(self, most: int = 6) -> str:
        """What ran outside the graphs, in one line: the ops (most run first), the values no graph made."""
        ops = sorted(self.ops.items(), key=lambda kv: (-kv[1], kv[0]))
        text = ", ".join(f"{op} x{n}" for op, n in ops[:most]) + (
            f" (and {len(ops) - most} more)" if len(ops) > most else "")
        if self.values:
            made = f"{', '.join(self.values[:4])}{' ...' if len(self.values) > 4 else ''} made by no graph"
            text = f"{text}; {made}" if text else made
        return text or "nothing"


class CaptureRecord(Record):
    mode: str
    options: dict[str, JsonValue]
    notes: list[str]
    # A dynamo capture: how many subgraphs (their graphs are keyed "<kind>_<i>" for i > 0),
    # and the graph breaks between them.
    subgraphs: Annotated[int, Field(ge=1)] | None = None
    graph_breaks: list[GraphBreakRecord] | None = None
    fallback: str | None = None  # mode auto: why export failed (the graphs are dynamo's)
    # Library namespaces whose ops the graphs call (the pipeline's trusted_ops).
    trusted_ops: dict[Identifier, TrustedNamespace] | None = None
    # A partial capture: what ran outside the graphs, per compile (absent: the graphs hold
    # the whole model, or the artefact was written before aotpipe told)
    outside_graphs: list[OutsideGraphs] | None = None


class ModelRecord(BaseModel):
    """The pipeline's model entry as it ran (config.ModelSpec, which validates the rest
    when a trusted rebuild uses it), less its pass chain: each chain is written once, in the
    graph entry of the graph it made (manifests written before also hold it here, as
    "passes", which nothing reads)."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str
    source: str


SizePoint = Literal["min", "example", "max", "random"]
SIZE_POINTS: tuple[str, ...] = get_args(SizePoint)


class DimRecord(Record):
    """One dimension a shape-polymorphic capture was asked to keep dynamic (manifest `dims`,
    version 4): a named dimension (`dims:`), or with `dims: auto` an input's leading one."""

    min: Count
    max: Count | None = None  # None: unbounded (dims: auto)
    example: Count
    status: Literal["dynamic", "specialised"]
    symbol: SymbolName | None = None  # the graphs' symbol for it (status dynamic)
    sources: list[Annotated[str, StringConstraints(max_length=256)]] = []  # input dimensions (x.size(0))
    reason: str | None = None  # status specialised: what fixed it, and where


class SizeCheckRecord(Record):
    """The checks of every graph at one point of the dimensions' ranges (manifest `dims.checked`):
    the inputs drawn as the example's were (the model's seed) at `sizes`, every graph run from its
    files and compared with the eager model; each output's digest and summary, which a replay at
    these sizes compares with."""

    point: SizePoint
    sizes: dict[str, Count]  # dimension (name or symbol) -> size
    note: str | None = None  # e.g. the max over the memory budget: the largest size that fits
    checks: CheckTotals | None = None
    problems: list[str] = []
    digests: dict[str, list[Sha256 | None]] = {}  # graph key -> per output
    summaries: dict[str, list[Summary | None]] = {}
    values: dict[str, list[bool | int | float | None]] = {}  # graph key -> scalar outputs (sizes)


class DimsRecord(Record):
    """manifest.json `dims` (version 4): the dimensions a capture kept symbolic, or could not,
    and the checks at min, example, max and a random size in range."""

    auto_dims: bool = False  # dims: auto (each input's leading dimension, as torch found it could be)
    dims: dict[str, DimRecord]
    checked: list[SizeCheckRecord] = []
    # the memory the size checks' graph values may take; None: the sizes were not checked (a
    # capture at the example sizes: auto's fallback to dynamo)
    budget_bytes: Count | None = None


class GroupRecord(Record):
    """One process group a distributed rank's graphs call (manifest `distributed.groups`, by the
    name the graphs' collectives give it): its mesh dimension and its ranks."""

    dim: Identifier
    ranks: list[Count]


class ParamShardRecord(Record):
    """One parameter's shard on a distributed rank: the whole parameter's shape, the rank's
    local piece (shape and offset into the whole) and the placement on each mesh dimension
    (Shard(0), Replicate(), StridedShard(0, split_factor=2): DTensor's words)."""

    shape: list[Count]
    local_shape: list[Count]
    offset: list[Count]
    placements: list[Annotated[str, StringConstraints(max_length=64)]]


class CollectiveRecord(Record):
    """One collective of a distributed rank's graph: where it is, its op, its group and the bytes
    its output holds on this rank."""

    graph: str
    node: str
    op: Identifier
    group: Annotated[str, StringConstraints(max_length=64)]
    dim: Identifier
    bytes: Count


class ValueRange(Record):
    """The finite values of one tensor when it was recorded (None: it held none) and how many
    were not finite (nan, inf)."""

    min: float | None = None
    max: float | None = None
    nonfinite: Count = 0


class CaseRecord(Record):
    """manifest.json `case` (version 4): the artefact is one per-op case `aotpipe ops --cases`
    mined from a corpus: its op on one set of argument layouts, dtypes and non-tensor
    arguments, the corpus nodes it stands for (`count`, the first few named as "<artefact>
    <graph> <node>"), and the value range of each tensor input when the first of them ran."""

    op: Annotated[str, StringConstraints(max_length=256)]
    count: Annotated[int, Field(ge=1)]
    nodes: list[Annotated[str, StringConstraints(max_length=1024)]]
    ranges: list[ValueRange | None] = []  # per input of the case's graph (None: not a tensor)


class DistributedRecord(Record):
    """manifest.json `distributed` (version 4): the model captured as one rank of a parallel
    world (spec/distributed.py): the world, the mesh, this rank's place, its groups, its shards
    and batch slice, and every collective its graphs hold. Each rank is an artefact of its own,
    `<model>.rank<r>` beside the others."""

    world_size: Annotated[int, Field(ge=2)]
    strategy: Identifier | Literal["fsdp2+tp", "ddp+tp"]
    mesh: list[Annotated[int, Field(ge=1)]]
    mesh_dims: list[Identifier]
    rank: Count
    coords: dict[Identifier, Count]
    groups: dict[Annotated[str, StringConstraints(max_length=64)], GroupRecord]
    shards: dict[str, ParamShardRecord]
    batch: list[Count] | None = None  # [offset, size, whole] of the rank's slice of the batch (data parallel)
    tensor_parallel: list[str] = []  # the module paths tensor parallelism split
    # the norms sequence parallelism runs on the rank's part of the sequence (sequence_parallel: true)
    sequence_parallel: list[str] = []
    collectives: list[CollectiveRecord] = []

    def per_step(self) -> dict[str, CollectiveTotal]:
        """The collectives of one training step by op. A step is the forward then the backward
        graph (the joint holds the same collectives once more); a rank captured with the joint
        alone, its joint's."""
        split = [c for c in self.collectives if c.graph in (GraphKind.FORWARD, GraphKind.BACKWARD)]
        return self._by_op(split or [c for c in self.collectives if c.graph == GraphKind.JOINT])

    def per_inference(self) -> dict[str, CollectiveTotal]:
        """The inference graph's collectives by op, per call."""
        return self._by_op([c for c in self.collectives if c.graph == GraphKind.INFERENCE])

    def _by_op(self, calls: list[CollectiveRecord]) -> dict[str, CollectiveTotal]:
        out: dict[str, CollectiveTotal] = {}
        for c in calls:
            group = self.groups.get(c.group)
            n = len(group.ranks) if group is not None else 1
            # What a ring algorithm has each rank send (nccl-tests' bus bytes), from the output's size.
            share = {"all_gather_into_tensor": c.bytes * (n - 1) // n, "reduce_scatter_tensor": c.bytes * (n - 1),
                     "all_reduce": 2 * c.bytes * (n - 1) // n}.get(c.op, 0)
            t = out.get(c.op, CollectiveTotal(0, 0, 0))
            out[c.op] = CollectiveTotal(t.calls + 1, t.bytes + c.bytes, t.sent + share)
        return out


class CollectiveTotal(NamedTuple):
    """Collectives of one op added up: calls, the bytes their outputs hold on the rank, and the
    bytes the rank sends for them in a ring algorithm (all-gather (n-1)/n of its output,
    reduce-scatter n-1 times its output, all-reduce 2(n-1)/n of it, over a group of n)."""

    calls: int
    bytes: int
    sent: int


_COLLECTIVE_WORDS: Final = {"all_gather_into_tensor": "all-gather", "reduce_scatter_tensor": "reduce-scatter",
                            "all_reduce": "all-reduce"}


def bytes_text(n: int) -> str:
    """Bytes as a person reads them."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def collectives_text(totals: dict[str, CollectiveTotal]) -> str:
    """Collectives by op (DistributedRecord.per_step's) in one phrase: calls per kind, then the
    bytes the rank sends for them."""
    if not totals:
        return "none"
    kinds = ", ".join(f"{_COLLECTIVE_WORDS.get(op, op)} {t.calls}" for op, t in sorted(totals.items()))
    return f"{kinds}; sends {bytes_text(sum(t.sent for t in totals.values()))}"


class Manifest(Record):
    """manifest.json: what a model folder holds, how it was made, and every file's sha256."""

    format_version: ReadableVersion
    fingerprint: Sha256
    checksum: Sha256  # sha256 of the rest (catches corruption, not forgery)
    versions: Versions
    model: ModelRecord
    capture: CaptureRecord
    save_values: ValuesMode | None = None  # version 2
    graphs: Annotated[dict[str, GraphEntry], FailFast]
    partition: Partition | None = None
    # Written before each chain was stored once (in its graph entry): a copy of every
    # graphs[key].passes, by key. Read only through pass_chains, for a graph entry without one.
    passes: dict[str, list[PassRecord]] = {}
    pass_failures: list[str] = []
    skipped_passes: list[SkippedPass] = []  # optional passes that failed and were left out
    verification: Annotated[dict[str, VerificationEntry], FailFast] | None = None
    checks: CheckTotals | None = None  # version 2
    environment: Environment | None = None  # version 3
    dims: DimsRecord | None = None  # version 4: a shape-polymorphic capture's dimensions and size checks
    distributed: DistributedRecord | None = None  # version 4: one rank of a parallel world
    case: CaseRecord | None = None  # version 4: a per-op case mined by aotpipe ops --cases
    files: Annotated[dict[str, Sha256], FailFast]

    def pass_chains(self) -> dict[str, list[PassRecord]]:
        """Each graph made by passes (by key, in the manifest's order): the chain that made it,
        as it ran. Read from its graph entry, the one copy; a manifest of any readable version
        whose entry lacks it gives the top-level copy older writers kept."""
        out = {}
        for key, entry in self.graphs.items():
            chain = entry.passes if entry.passes is not None else self.passes.get(key)
            if chain is not None:
                out[key] = chain
        return out


# ---------------------------------------------------------------------------------------
# run.json (one per pipeline run, beside the model folders; not part of any artefact)


class GraphSummary(Record):
    """One graph a model's run wrote (or kept): its key, folder and size."""

    kind: str  # the graph's key: "inference", "forward_1", "inference.freeze+reinplace"
    folder: FolderName
    nodes: Count
    inputs: Count
    outputs: Count


class CheckSummary(CheckTotals):
    """A model's checks in brief: its manifest's totals, and every skipped check's reason
    ("<graph key>: <reason>")."""

    skipped_reasons: list[str] = []


class EagerCell(CheckTotals):
    """One graph's checks in brief: its counts and its worst error as a multiple of eager's own
    (None where no check needed the float64 reference)."""

    worst_ratio: Number = None
    skipped_reasons: list[str] = []


class TimedPassRecord(PassRecord):
    """A pass as it ran, with its time (run.json only: the manifest is deterministic)."""

    seconds: float


class PassChainRun(Record):
    """What a pass chain did to one graph, and how long it took."""

    seconds: float
    steps: list[TimedPassRecord]


class VerificationSummary(Record):
    """How a model's graphs ran at write time: each one's status ("recorded", "match", ...),
    and a line per problem (none: ok)."""

    ok: bool
    graphs: dict[str, str]
    problems: list[str]


class RunStamp(Record):
    """Which run: its id (unique to it) and when it started (UTC, ISO 8601, to the second)."""

    id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    started: Annotated[str, StringConstraints(max_length=64)]


class ModelRun(Record):
    """run.json's record of one model: what happened, where it stopped, what it wrote.

    Version 3: an entry a run did not redo is kept as it was (its figures are from the run
    that made them: `measured_in`); see RunRecord.kept and has_measurement."""

    name: str
    # partial (version 2): written and checked, but part of the model ran outside its graphs
    status: StatusField
    stage: str | None = None  # where it failed: vocabulary.Stage (a word of an older run is kept)
    error: str | None = None
    # The exception's class when the failure was not an aotpipe error (the model's code, torch).
    exception: str | None = None
    graphs: list[GraphSummary] = []
    capture_seconds: float = 0.0
    passes_seconds: float = 0.0
    checks_seconds: float = 0.0
    write_seconds: float = 0.0
    verification: VerificationSummary | None = None
    checks: CheckSummary | None = None
    eager: dict[str, EagerCell] = {}  # per graph key
    passes: dict[str, PassChainRun] = {}  # per graph made by passes
    skipped_passes: list[SkippedPass] = []  # optional passes that failed and were left out (the manifest's)
    total_seconds: float = 0.0
    bytes: Count = 0
    files: Count = 0
    notes: list[str] = []
    skipped: bool = False  # up to date: the artefact on disk was kept
    # true: it ran out of memory in this folder's runs before, and starts in a fresh worker
    # (process executor); kept from run to run (runner.ran_out_of_memory_last_run)
    fresh_worker: bool | None = None
    # status partial: one line per graph break past which the model computed outside its
    # graphs (the break's reason and source line, the ops that ran outside)
    outside_graphs: list[str] | None = None
    # version 3: the run that measured this entry's figures (times, status, checks); absent
    # where none did (an artefact kept as up to date that no finished run had timed)
    measured_in: RunStamp | None = None
    # version 3, ok and partial entries: the sha256 of the manifest.json the figures belong to
    # (a later run keeps them for that artefact only)
    manifest_sha256: Sha256 | None = None

    def has_measurement(self) -> bool:
        """Whether the times are a measurement of this model (by the run named in measured_in,
        or, in a file without it, by this entry's run); false for an artefact kept as up to
        date without one (its times are then zero and mean nothing: reports show "-")."""
        return self.measured_in is not None or not self.skipped


class RecycledWorker(Record):
    """A process-executor worker replaced between models (executor.max_models_per_worker,
    executor.recycle_memory_gb): not a failure."""

    pid: int
    after: str  # the last model it ran
    models: Count  # how many it ran
    reason: str  # one line
    shard: str | None = None  # in a merged run: the shard folder whose run replaced it
    out_of_memory: bool | None = None  # true: `after` ran out of memory in it (and ran again afresh)


class ExecutorRecord(Record):
    kind: str
    workers: Annotated[int, Field(ge=1)]
    recycled: list[RecycledWorker] | None = None  # absent when no worker was replaced


class ShardRecord(Record):
    """`aotpipe run --shard I/N`: which shard, and every model the shards share out."""

    index: Annotated[int, Field(ge=1)]
    count: Annotated[int, Field(ge=1)]
    selection: list[str]


class MergedShard(Record):
    folder: str
    shard: str | None  # "I/N", None for an unsharded run
    models: Count
    seconds: float | None = None
    run: RunStamp | None = None  # version 3: the shard's run (its entries count as the merged run's own)


class DuplicatedModel(Record):
    name: str
    folders: list[str]  # the first one's folder was kept


class MergeRecord(Record):
    """`aotpipe merge`: the shard trees merged, and the models missing from all or run twice."""

    shards: list[MergedShard]
    missing: list[str]
    duplicated: list[DuplicatedModel]


class SettledTotals(Record):
    """How a run's checks were settled, summed over its models (CheckTotals' counts)."""

    run: Count
    skipped: Count
    exact: Count
    floor: Count
    fp64: Count
    within_noise: Count


class RunSummary(Record):
    models: Count
    ok: Count
    up_to_date: Count
    failed: Count
    graphs: Count
    bytes: Count
    checks: SettledTotals | None = None
    partial: Count | None = None  # version 2: models whose status is partial (not counted as ok)
    kept: Count | None = None  # version 3: entries kept from earlier runs (RunRecord.kept)


class DroppedModel(Record):
    """An entry of the run.json before that this one no longer lists, and why."""

    name: str
    reason: str  # one line


class RunRecord(Record):
    """run.json: one pipeline run, for machines (report.md says the same for people).

    Version 3: run.json describes the output tree, not only what the last command did. An
    entry the run did not redo (a model up to date, or not selected by --only) is kept from
    the run.json before, its figures as the run that measured them recorded them."""

    format_version: Literal[1, 2, 3]  # RUN_FORMAT_VERSION (2: status partial; 3: kept entries)
    pipeline: str
    versions: Versions
    seconds: float
    executor: ExecutorRecord
    shard: ShardRecord | None = None  # a shard's run
    merge: MergeRecord | None = None  # a merged run
    ok: bool
    summary: RunSummary
    models: list[ModelRun]
    allow_partial: bool | None = None  # version 2: `run --allow-partial`: partial models did not make ok false
    run: RunStamp | None = None  # version 3: this run
    dropped: list[DroppedModel] | None = None  # version 3: entries of the run.json before, not carried over

    def own_runs(self) -> set[str]:
        """The ids of the runs whose entries count as this record's own: its run's, and in a
        merged run, the shards' runs'."""
        ids = {self.run.id} if self.run is not None else set()
        return ids | {s.run.id for s in (self.merge.shards if self.merge is not None else []) if s.run is not None}

    def kept(self, m: ModelRun) -> bool:
        """Whether entry `m` was kept from an earlier run rather than measured by this one (in a
        file before version 3: whether its model was found up to date)."""
        if self.run is None:
            return m.skipped
        return m.measured_in is None or m.measured_in.id not in self.own_runs()


def load_run(path: Any) -> RunRecord:
    """A run.json (its path, or the run's output folder) as a RunRecord, read within the
    limits and validated; an ArtifactError naming the file and the first bad field otherwise."""
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        path = path / RUN_JSON
    return read(RunRecord, path)[1]


class Signature(Record):
    """signature.json: a signature over the context line and manifest.json's bytes."""

    format_version: Literal[1]
    algorithm: Literal["ed25519", "hmac-sha256"]
    key_id: Annotated[str, StringConstraints(max_length=128)]
    signed_file: Literal["manifest.json"]
    manifest_sha256: Sha256
    signature: Annotated[str, StringConstraints(max_length=4096)]  # base64


# ---------------------------------------------------------------------------------------
# Validation


def check_version(data: RawJson, where: Any) -> None:
    """Refuse a record of a format version this aotpipe does not read, saying which it reads."""
    version = data.get("format_version") if isinstance(data, dict) else None
    if version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise ArtifactError(
            f"{where}: format version {repr(version)[:40]}; this aotpipe reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}" + ("; upgrade aotpipe to read it" if newer else "")
        )


_R = TypeVar("_R", bound=Record)
_B = TypeVar("_B", bound=BaseModel)


def parse(cls: type[_R], data: RawJson, where: Any) -> _R:
    """`data` (parsed JSON) as a `cls` record; an ArtifactError naming `where` and the first
    bad field otherwise (for a record of the artefact format, its version first)."""
    if cls in VERSIONED:
        check_version(data, where)
    if cls is Manifest and isinstance(data, dict) and isinstance(data.get("graphs"), dict):
        check_graphs(len(data["graphs"]), where)  # before validating each one
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ArtifactError(f"{where}: {describe(e)}") from None


def updated(record: _B, **changes: Any) -> _B:
    """A copy of `record` with `changes`, validated as its class validates a new one (pydantic's
    model_copy(update=...) checks nothing: a wrong type or an unknown field would be written).
    The fields set in `record` stay set, and no other (a default left out of a file stays out)."""
    return type(record).model_validate({**{k: getattr(record, k) for k in record.model_fields_set}, **changes})


def read(cls: type[_R], path: Any, root: Any = None) -> tuple[RawJson, _R]:
    """(the raw data, the record) of a record file, read within the limits (regular files
    only: no FIFO, no link to a device) and validated. The raw data is what a checksum covers."""
    raw = read_json(path, root)
    return raw, parse(cls, raw, path)


def describe(e: ValidationError) -> str:
    """The first problem of a validation error in one line: field path, message, value."""
    errs = e.errors(include_url=False)
    first: ErrorDetails = errs[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(the record)"
    value = first.get("input")
    shown = json.dumps(value, default=str)[:60] if not isinstance(value, (dict, list)) else type(value).__name__
    more = f" (and {len(errs) - 1} more problems)" if len(errs) > 1 else ""
    msg = first["msg"].rstrip(".")
    if first["type"] == "literal_error" and len(msg) > 120:  # e.g. every dtype torch has
        msg = f"not one of the {msg.count(',') + 1} values it may take (see aotpipe schema --artifact)"
    return f"field {loc}: {msg} (got {shown}){more}"


def check_written(cls: type[Record], data: dict[str, Any], where: Any) -> dict[str, Any]:
    """What the writer is about to write, checked against the format it promises readers."""
    parse(cls, data, where)
    return data


VERSIONED: tuple[type[Record], ...] = (Manifest, InputsRecord, TraceRecord, GraphRecord)

RECORDS: dict[str, type[Record]] = {
    MANIFEST: Manifest,
    INPUTS_JSON: InputsRecord,
    TRACE: TraceRecord,
    GRAPH_JSON: GraphRecord,
    SIGNATURE: Signature,
    RUN_JSON: RunRecord,
}

# Each record file's version as written now, and the versions of it this aotpipe reads
# (tools/format_schema.py holds field changes to them: docs/format/README.md).
# run.json version 2: a model's status may be "partial" (version 1 said ok or failed).
# Version 3: entries kept from earlier runs (ModelRun.measured_in, RunRecord.run).
RUN_FORMAT_VERSION = 3
SIGNATURE_FORMAT_VERSION = 1
RECORD_VERSIONS: dict[str, tuple[int, tuple[int, ...]]] = {
    MANIFEST: (FORMAT_VERSION, READABLE_VERSIONS),
    INPUTS_JSON: (FORMAT_VERSION, READABLE_VERSIONS),
    TRACE: (FORMAT_VERSION, READABLE_VERSIONS),
    GRAPH_JSON: (GRAPH_FORMAT_VERSION, (1, GRAPH_FORMAT_VERSION)),
    SIGNATURE: (SIGNATURE_FORMAT_VERSION, (SIGNATURE_FORMAT_VERSION,)),
    RUN_JSON: (RUN_FORMAT_VERSION, (1, 2, RUN_FORMAT_VERSION)),
}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of every record file of the format, keyed by file name."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"aotpipe artefact format, version {FORMAT_VERSION} (reads {', '.join(map(str, READABLE_VERSIONS))})",
        "description": __doc__ or "",
        "files": {name: cls.model_json_schema() for name, cls in RECORDS.items()},
    }
