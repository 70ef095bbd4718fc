"""Reproducible runs: one seed, one definition of "draws random numbers", deterministic kernels.

Capture, checks and replay all run graphs (and the eager model) through :func:`reproducible`:
the global generator is seeded with :data:`RNG_SEED` so random ops (dropout) draw the same
numbers in the graph as in eager, and ``torch.use_deterministic_algorithms`` picks the
deterministic kernel of ops that have two (``index_put_`` with accumulate: an embedding's
backward). Ops that torch says have no deterministic kernel are reported, not hidden.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import platform
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
import torch.fx

from aotpipe.format.records import Environment
from aotpipe.runtime.devices import PACKING

# Seed set before every seeded run (graph or eager), at capture and at replay.
RNG_SEED = 0

_NONDETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")


def op_draws_random(target: Any) -> bool:
    """Whether an FX call target draws from the random generator (torch's own tag)."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def draws_random(gm: torch.fx.GraphModule) -> bool:
    """Whether any node of the graph draws random numbers."""
    return any(n.op == "call_function" and op_draws_random(n.target) for n in gm.graph.nodes)


@dataclass
class RunLog:
    """What a reproducible run found: kernels torch could not make deterministic."""

    nondeterministic: list[str] = field(default_factory=list)


@contextlib.contextmanager
def reproducible(seed: bool = True, strict: bool = False) -> Iterator[RunLog]:
    """Deterministic kernels (and a seeded generator) for the duration; restores the caller's settings.

    `strict`: an op without a deterministic kernel raises (every time; torch warns only once
    per process). Otherwise it runs, and the yielded :class:`RunLog` names it if torch warns.
    """
    log = RunLog()
    was_det = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    rng = torch.random.get_rng_state() if seed else None
    # torch.use_deterministic_algorithms would also set inductor's flag, importing
    # torch._inductor; aotpipe runs no inductor code and loads without it: ATen's flag only.
    torch._C._set_deterministic_algorithms(True, warn_only=not strict)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            if seed:
                torch.manual_seed(RNG_SEED)
            yield log
        for w in caught:
            m = _NONDETERMINISTIC.search(str(w.message))
            if m and m.group(1) not in log.nondeterministic:
                log.nondeterministic.append(m.group(1))
            elif not m:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    finally:
        torch._C._set_deterministic_algorithms(was_det, warn_only=was_warn)
        if rng is not None:
            torch.random.set_rng_state(rng)


T = TypeVar("T")


def run_reproducibly(fn: Callable[[], T], *, seed: bool = True, log: Optional[RunLog] = None) -> T:
    """`fn()` with deterministic kernels and a seeded generator; an op that has no
    deterministic kernel is named in `log` and the run repeated allowing it."""
    try:
        with reproducible(seed, strict=True):
            return fn()
    except RuntimeError as e:
        m = _NONDETERMINISTIC.search(str(e))
        if not m:
            raise
        if log is not None and m.group(1) not in log.nondeterministic:
            log.nondeterministic.append(m.group(1))
        with reproducible(seed, strict=False) as ran:
            out = fn()
        if log is not None:
            log.nondeterministic += [o for o in ran.nondeterministic if o not in log.nondeterministic]
        return out


@contextlib.contextmanager
def intra_op_threads(n: Optional[int]) -> Iterator[int]:
    """Run the block with `n` intra-op threads (None: as now); yields the count in force and
    restores the caller's afterwards. Some kernels (a convolution's weight gradient) split
    their sums by thread, so the bits of their results depend on it."""
    was = torch.get_num_threads()
    if n is not None and n != was:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != was:
            torch.set_num_threads(was)


def environment(device: str = "cpu") -> Environment:
    """What decides the bits of a graph's outputs here, besides the graph and its inputs:
    intra-op threads, the CPU instruction set torch's kernels dispatch to, torch's version,
    the deterministic settings graphs run under (:func:`reproducible`) and the CPU
    libraries torch was built with. The manifest records it (manifest.environment)."""
    return Environment(
        device=device,
        threads=torch.get_num_threads(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        torch=torch.__version__,
        # What reproducible() sets for every graph run: always so with this aotpipe.
        deterministic_algorithms=True,
        fill_uninitialized_memory=bool(torch.utils.deterministic.fill_uninitialized_memory),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        mkldnn=bool(torch.backends.mkldnn.is_available()),
        mkl=bool(torch.backends.mkl.is_available()),
        cpu=cpu_model(),
        packing=PACKING,
    )


# Instruction-set features that select MKL's and oneDNN's kernels (and so the bits of a
# matmul or a convolution) beyond torch's own cpu_capability: two machines of the same kind,
# both AVX512 to torch, gave other float32 GEMM bits for the same graph (the fixtures of
# tests/data, made on one, replayed on a GenuineIntel 6/207/2). x86 /proc/cpuinfo names,
# then Arm's.
KERNEL_FEATURES = frozenset({
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd", "avx512ifma",
    "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512_bitalg", "avx_vnni",
    "avx_vnni_int8", "avx_ne_convert", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "amx_complex",
    "asimd", "asimddp", "asimdhp", "sve", "sve2", "bf16", "i8mm", "sme",
})


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """This CPU: "GenuineIntel 6/143/8 | avx avx2 ...", its vendor and family/model/stepping
    (x86) or implementer/part/variant (Arm), then every feature flag /proc/cpuinfo lists
    (else what the platform module says). All of them, so that a later aotpipe that knows
    more of the flags that decide kernels (:data:`KERNEL_FEATURES`) still compares them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    return cpu_from_cpuinfo(text)


def cpu_from_cpuinfo(text: str) -> str:
    """:func:`cpu_model` from the text of /proc/cpuinfo (its first processor's block)."""
    first = text.split("\n\n", 1)[0]
    fields: dict[str, str] = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    if "vendor_id" in fields:
        ident = f"{fields['vendor_id']} " + "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping"))
    elif "CPU implementer" in fields:
        ident = "arm " + "/".join(fields.get(k, "?") for k in ("CPU implementer", "CPU part", "CPU variant"))
    else:
        ident = " ".join(x for x in (platform.machine(), platform.processor()) if x) or "unknown"
    flags = sorted(set((fields.get("flags") or fields.get("Features") or "").split()))
    return " | ".join([ident, " ".join(flags)]) if flags else ident


def _cpu_difference(now: str, recorded: str) -> str:
    """"other CPU model: GenuineIntel 6/143/8, recorded GenuineIntel 6/85/7", or where only the
    features differ, "other CPU features than recorded: +amx_tile -avx512_fp16" (this CPU has
    amx_tile, the recorded one had avx512_fp16)."""
    now_id, now_f = cpu_parts(now)
    rec_id, rec_f = cpu_parts(recorded)
    if now_id != rec_id:
        return f"other CPU model: {now_id}, recorded {rec_id}"
    changes = [f"+{x}" for x in sorted(now_f - rec_f)] + [f"-{x}" for x in sorted(rec_f - now_f)]
    return f"other CPU features than recorded: {' '.join(changes)}"


def cpu_parts(cpu: str) -> tuple[str, frozenset[str]]:
    """(identity, the flags among :data:`KERNEL_FEATURES`) of a :func:`cpu_model` string:
    what decides kernels, so what a replay compares."""
    ident, _, flags = cpu.partition(" | ")
    return ident.strip(), frozenset(flags.split()) & KERNEL_FEATURES


def unrecorded_cpu(recorded: Optional[Environment]) -> Optional[str]:
    """Why a bit difference cannot be taken as a fault: the artefact does not record the CPU
    its outputs were recorded on (format 1 and 2 record no environment; early version 3
    artefacts no `cpu`). None where it does."""
    if recorded is None:
        return "its CPU is not recorded: an artefact of format version < 3"
    if recorded.cpu is None:
        return "its CPU is not recorded: written before aotpipe recorded it"
    return None


def environment_differences(recorded: Optional[Environment], now: Environment) -> list[str]:
    """Why bits recorded in `recorded` cannot be expected `now`, one short phrase each, the
    way a replay report says them ("other CPU: avx2, recorded avx512", "2 threads, recorded
    1"); empty when nothing that decides bits differs, or nothing was recorded
    (:func:`unrecorded_cpu` says what that means)."""
    if recorded is None:
        return []
    out = []
    if now.device != recorded.device:
        out.append(f"device {now.device}, recorded {recorded.device}")
    if now.cpu_capability != recorded.cpu_capability:
        out.append(f"other CPU: {now.cpu_capability.lower()}, recorded {recorded.cpu_capability.lower()}")
    if now.cpu is not None and recorded.cpu is not None and cpu_parts(now.cpu) != cpu_parts(recorded.cpu):
        out.append(_cpu_difference(now.cpu, recorded.cpu))
    if now.torch != recorded.torch:
        out.append(f"torch {now.torch}, recorded {recorded.torch}")
    if now.threads != recorded.threads:
        out.append(f"{now.threads} thread{'s' if now.threads != 1 else ''}, recorded {recorded.threads}")
    for key, what, yes, no in (("deterministic_algorithms", "deterministic algorithms", "on", "off"),
                               ("fill_uninitialized_memory", "fill_uninitialized_memory", "on", "off"),
                               ("float32_matmul_precision", "float32 matmul precision", "", ""),
                               ("mkldnn", "oneDNN", "available", "missing"), ("mkl", "MKL", "available", "missing")):
        if getattr(now, key) != getattr(recorded, key):
            def shown(v: Any) -> str:
                return (yes if v else no) if isinstance(v, bool) else str(v)
            out.append(f"{what} {shown(getattr(now, key))}, recorded {shown(getattr(recorded, key))}")
    return out


def derived_seed(seed: int, *parts: str) -> int:
    """A 63-bit seed from the pipeline seed and names: stable across processes and machines."""
    digest = hashlib.sha256(":".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
