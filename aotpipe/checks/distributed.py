"""The ranks of a distributed model checked together: every rank's written graphs run at once,
one local process per rank over a real process group (gloo), and held to the single-process
eager model by the float64 rule (runtime/accuracy.py).

Each rank process (:func:`main`, ``python -m aotpipe.checks.distributed``) loads its rank's
artefact from its files, sets up the world and the mesh the capture recorded, maps each
process group the graphs name to the live group of the same mesh dimension, and runs its
graphs on their saved inputs: the joint (its loss and its gradients), the forward then the
backward (the same), the inference graph (its outputs). What they give comes back to the
parent, which compares, rank by rank:

- the loss: the data-parallel ranks' losses (one per row of the mesh) add up to eager's loss
  of the whole batch (capture/distributed.RankLoss);
- each gradient: the rank's shard against the same slice of eager's whole gradient (a
  reduce-scatter over the wrong group, or one left out, leaves a shard that is not the
  slice);
- each inference output: against eager's output at the rank's batch slice.

One problem per failing value, naming the rank, the graph and the parameter or output.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import init_device_mesh

from aotpipe.artifact.load import load
from aotpipe.errors import ArtifactError
from aotpipe.format.graph_keys import key_order
from aotpipe.format.records import CheckTotals, DistributedRecord, VerificationEntry
from aotpipe.format.vocabulary import GraphKind
from aotpipe.models.eager import model_loss
from aotpipe.runtime.accuracy import compare, digest
from aotpipe.runtime.execution import run_graph

# How long the ranks may take together, per rank, before the check gives up on them.
RANK_SECONDS = 300

# The key of the check's entry in each rank's manifest `verification`.
RANKS_KEY = "ranks"


@dataclass
class RanksOutcome:
    """The check of all ranks: per rank its verification entry (manifest `verification.ranks`),
    and the problems (each naming its rank) that fail the model."""

    entries: dict[int, VerificationEntry] = field(default_factory=dict)
    totals: dict[int, CheckTotals] = field(default_factory=dict)  # per rank: the manifest's `checks`
    problems: list[str] = field(default_factory=list)
    compared: int = 0
    seconds: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_threads(world: int) -> int:
    """The intra-op threads each rank process runs at: this machine's cores shared out."""
    return max(1, (os.cpu_count() or 1) // world)


def spawn_world(module: str, argv: Callable[[int], list[str]], world: int, timeout: float, *,
                threads: int | None = None) -> None:
    """``python -m <module> *argv(r)`` for every rank r of a world of `world`, run together: one local
    process per rank, with the address of a free local port for their process group and `threads`
    intra-op threads each (default: this machine's cores shared out). Raises RuntimeError naming
    the first rank that failed (its last line), or the one still running at `timeout` seconds.
    A rank that fails leaves the others waiting on it: they are given FAILED_GRACE seconds, then
    killed. The processes stay in the caller's process group, so a caller killed (a bench
    worker over its time) takes them with it."""
    port = _free_port()
    threads = threads if threads is not None else rank_threads(world)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with tempfile.TemporaryDirectory(prefix="aotpipe-world-") as tmp:
        logs = {r: open(Path(tmp) / f"rank{r}.err", "w+") for r in range(world)}  # files: a pipe could fill
        try:
            procs = {r: subprocess.Popen([sys.executable, "-m", module, *argv(r)], env=env, stdout=subprocess.DEVNULL,
                                         stderr=logs[r], text=True)
                     for r in range(world)}
            killed, late = _wait_world(procs, time.monotonic() + timeout)
            errors, lost = {}, set()
            for r, p in procs.items():
                if p.returncode != 0 and r not in killed:
                    logs[r].seek(0)
                    text = logs[r].read()
                    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(" ")]
                    errors[r] = lines[-1] if lines else f"exit status {p.returncode}"
                    if any(m in text for m in _PEER_LOST):
                        lost.add(r)
        finally:
            for f in logs.values():
                f.close()
    if errors:
        # The rank that failed of itself, first: the others' collectives then fail for want of it.
        first = min(errors, key=lambda r: (r in lost, r))
        raise RuntimeError(f"rank {first} failed: {errors[first]}" + (
            f" (ranks {', '.join(map(str, sorted(errors)))} failed)" if len(errors) > 1 else ""))
    if late:
        raise RuntimeError(f"the ranks did not finish within {timeout:.0f} s (rank {min(killed)} still running)")


# How long the other ranks of a world may go on once one has failed (they wait on it).
FAILED_GRACE = 5.0
# What gloo says in a rank whose peer went away: that rank failed for another's failure.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")


def _wait_world(procs: dict[int, subprocess.Popen[str]], deadline: float) -> tuple[set[int], bool]:
    """Wait for every rank's process; kill those still running at `deadline`, or FAILED_GRACE
    seconds after one failed. (The ranks killed, whether at the deadline.)"""
    failed_at: float | None = None
    while True:
        running = [r for r, p in procs.items() if p.poll() is None]
        if not running:
            return set(), False
        now = time.monotonic()
        if failed_at is None and any(p.returncode not in (0, None) for p in procs.values()):
            failed_at = now
        if now >= deadline or (failed_at is not None and now - failed_at >= FAILED_GRACE):
            for r in running:
                procs[r].kill()
                procs[r].wait()
            return set(running), failed_at is None
        time.sleep(0.01)


@contextlib.contextmanager
def joined(rec: DistributedRecord, rank: int) -> Iterator[dict[str, str]]:
    """In a rank's process (started by :func:`spawn_world`): this process joined to its world over
    gloo with the mesh the capture recorded; yields each mesh dimension's live group name."""
    if rec.rank != rank:
        raise SystemExit(f"not rank {rank} of a world of {rec.world_size} (its manifest's distributed record says "
                         f"rank {rec.rank})")
    # A peer that died or went another way leaves a collective waiting: it fails after
    # RANK_SECONDS rather than gloo's half hour.
    dist.init_process_group("gloo", rank=rank, world_size=rec.world_size, timeout=timedelta(seconds=RANK_SECONDS))
    try:
        mesh = init_device_mesh("cpu", tuple(rec.mesh), mesh_dim_names=tuple(rec.mesh_dims))
        yield {d: str(mesh[d].get_group().group_name) for d in rec.mesh_dims}
    finally:
        dist.destroy_process_group()


def run_ranks(folders: dict[int, Path], record: DistributedRecord, timeout: float | None = None, *,
              own_capture: bool = True) -> dict[int, dict[str, GraphRun]]:
    """Every rank's graphs run together (one process per rank over gloo): what each gave, by rank.
    `own_capture`: the folders are what this process's capture just wrote (ops.OWN_CAPTURE); else
    each rank loads its artefact under the allow-list like any other."""
    world = record.world_size
    if sorted(folders) != list(range(world)):
        raise ValueError(f"the check runs every rank of the world ({world}); it was given ranks {sorted(folders)}")
    with tempfile.TemporaryDirectory(prefix="aotpipe-ranks-") as tmp:
        spawn_world("aotpipe.checks.distributed",
                    lambda r: [str(folders[r]), str(r), str(world), str(Path(tmp) / f"rank{r}.pt"),
                               "own" if own_capture else "elsewhere"],
                    world, timeout if timeout is not None else RANK_SECONDS * world)
        return {r: {key: GraphRun(**ran) for key, ran in torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True).items()}
                for r in folders}


@dataclass
class GraphRun:
    """What one rank's graph gave: its loss, its gradients by parameter, its outputs (inference)."""

    loss: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: list[torch.Tensor] | None = None
    digests: list[str | None] = field(default_factory=list)  # every output's (accuracy.digest), in order


@dataclass
class _Eager:
    """The whole model on the whole batch in one dtype."""

    outputs: list[torch.Tensor]
    loss: torch.Tensor
    grads: dict[str, torch.Tensor | None]


@dataclass
class _Tally:
    """A rank's checks, counted as the manifest's `checks` counts them."""

    run: int = 0
    passed: int = 0
    failed: int = 0
    exact: int = 0
    floor: int = 0
    fp64: int = 0

    def add(self, passed: bool, method: str) -> None:
        self.run += 1
        self.passed += passed
        self.failed += not passed
        if method == "floor":
            self.floor += 1
        elif method == "fp64":
            self.fp64 += 1
        else:
            self.exact += 1  # exact, or none (None on both sides)


def _eager(model: torch.nn.Module, args: tuple, kwargs: dict, loss: str, dtype: torch.dtype) -> _Eager:
    """The whole model in `dtype` on the whole batch: its inference outputs, its training loss
    and every parameter's gradient."""
    m = copy.deepcopy(model).to(dtype)

    def cast(v: Any) -> Any:
        return v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    a, k = pytree.tree_map(cast, (args, kwargs))
    m.eval()
    with torch.no_grad():
        outputs = [t for t in pytree.tree_leaves(m(*a, **k)) if isinstance(t, torch.Tensor)]
    m.train()
    m.zero_grad()
    value = model_loss(m(*a, **k), loss)
    value.backward()
    grads = {n: p.grad.detach().clone() if p.grad is not None else None for n, p in m.named_parameters()}
    m.eval()
    return _Eager(outputs, value.detach(), grads)


def _region(shape: list[int], offset: list[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))


_COLLECTIVES = {"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"}


@dataclass(frozen=True)
class _Call:
    """One collective as a rank's written graph calls it."""

    op: str
    group: str  # the name the graph gives (the rank's own)
    what: str  # what must match across the group's ranks: sizes, dtype, reduction
    node: str


def written_collectives(folder: Path) -> dict[str, list[_Call]]:
    """Each graph's collectives in graph order, read from its graph.json (nothing run)."""
    out: dict[str, list[_Call]] = {}
    for key, ga in load(folder, own_capture=True).graphs.items():
        calls = []
        for node in ga.structure.graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) \
                    or target.namespace != "_c10d_functional":
                continue
            op = target._schema.name.split("::")[1]
            if op not in _COLLECTIVES:
                continue
            val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
            shape = f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}" if isinstance(val, torch.Tensor) else "?"
            extra = [str(a) for a in node.args[1:-1]]
            calls.append(_Call(op, str(node.args[-1]), " ".join([shape, *extra]), node.name))
        out[key] = calls
    return out


def order_problems(calls: dict[int, dict[str, list[_Call]]], records: dict[int, DistributedRecord]) -> list[str]:
    """Where the ranks' graphs would not meet: a collective on a group its rank's mesh does not
    have, or the members of a group calling different collectives (or sizes) at the same place
    in the same graph, which on real ranks hangs or fails. One line per graph and group."""
    problems = []
    for r, by_key in sorted(calls.items()):
        for key, cs in by_key.items():
            for c in cs:
                if c.group not in records[r].groups:
                    problems.append(f"rank {r}: {key}: {c.node} ({c.op}) calls group {c.group!r}, which is none of "
                                    f"its mesh's ({', '.join(sorted(records[r].groups))})")
    if problems:
        return problems
    keys = sorted({k for by_key in calls.values() for k in by_key})
    for key in keys:
        per_group: dict[tuple[str, tuple[int, ...]], dict[int, list[_Call]]] = {}
        for r, by_key in calls.items():
            for name, g in records[r].groups.items():
                per_group.setdefault((g.dim, tuple(g.ranks)), {})[r] = [c for c in by_key.get(key, []) if c.group == name]
        for (dim, ranks), seqs in sorted(per_group.items()):
            members = [m for m in ranks if m in seqs]
            if not members:
                continue
            first = members[0]
            for other in members[1:]:
                a, b = seqs[first], seqs[other]
                i = next((j for j in range(max(len(a), len(b)))
                          if j >= len(a) or j >= len(b) or (a[j].op, a[j].what) != (b[j].op, b[j].what)), None)
                if i is None:
                    continue
                problems.append(f"{key}: collective #{i + 1} on the {dim} group {list(ranks)}: {_said(first, a, i)} "
                                f"where {_said(other, b, i)}: the ranks would not meet (on real ranks: a hang or a "
                                "failure)")
                break
    return problems


def _said(rank: int, seq: list[_Call], i: int) -> str:
    """What rank `rank` calls as its `i`-th collective on a group."""
    return f"rank {rank}'s is {seq[i].op}({seq[i].what}) ({seq[i].node})" if i < len(seq) else \
        f"rank {rank} has none (it calls {len(seq)})"


def check_ranks(folders: dict[int, Path], records: dict[int, DistributedRecord], model: torch.nn.Module,
                args: tuple, kwargs: dict, loss: str, timeout: float | None = None) -> RanksOutcome:
    """Run every rank's written graphs together and hold them to the eager model (see the module).
    First, the ranks' collectives are matched group by group (:func:`order_problems`): ranks
    whose graphs would not meet are not run."""
    start = time.perf_counter()
    outcome = RanksOutcome()
    record = records[0]
    try:
        unmet = order_problems({r: written_collectives(f) for r, f in folders.items()}, records)
        if unmet:
            raise RuntimeError("; ".join(unmet[:3]) + (f" (and {len(unmet) - 3} more)" if len(unmet) > 3 else ""))
        got = run_ranks(folders, record, timeout)
    except RuntimeError as e:
        for r in folders:
            outcome.entries[r] = VerificationEntry(status="error", error=str(e)[:500])
        outcome.problems.append(f"ranks: {e}")
        outcome.seconds = time.perf_counter() - start
        return outcome
    e32 = _eager(model, args, kwargs, loss, torch.float32)
    e64 = _eager(model, args, kwargs, loss, torch.float64)
    per_rank: dict[int, list[str]] = {r: [] for r in folders}
    counted: dict[int, _Tally] = {r: _Tally() for r in folders}

    def judge(r: int, what: str, actual: Any, expected: Any, reference: Any) -> None:
        check = compare(actual, expected, reference, what=what)
        counted[r].add(check.passed, check.method)
        if not check.passed:
            per_rank[r].append(f"rank {r}: {what}: {check.detail}")

    # the loss: one rank per data-parallel row (tensor-parallel ranks hold the same loss)
    for key in (GraphKind.JOINT, GraphKind.FORWARD):
        rows = [r for r in folders if key in got[r] and records[r].coords.get("tp", 0) == 0]
        if rows:
            losses = [got[r][key].loss for r in rows]
            present = [x.double() for x in losses if x is not None]
            total = torch.stack(present).sum().float() if len(present) == len(losses) else None
            judge(rows[0], f"{key}: the ranks' losses added", total, e32.loss, e64.loss)
    for r in folders:
        rec = records[r]
        for key in (GraphKind.JOINT, GraphKind.BACKWARD):
            ran = got[r].get(key)
            grads = ran.grads if ran is not None else {}
            for name, g in sorted(grads.items()):
                shard = rec.shards.get(name)
                whole32, whole64 = e32.grads.get(name), e64.grads.get(name)
                if shard is None or whole32 is None or whole64 is None:
                    per_rank[r].append(f"rank {r}: {key}: a gradient for {name}, which eager does not have")
                    continue
                where = _region(shard.local_shape, shard.offset)
                judge(r, f"{key}: gradient of {name} (shard at {shard.offset})", g, whole32[where].contiguous(),
                      whole64[where].contiguous())
            if ran is not None:
                missing = sorted(n for n in rec.shards if n not in grads and e32.grads.get(n) is not None)
                if missing:
                    per_rank[r].append(f"rank {r}: {key}: no gradient for {missing[0]}"
                                       + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
        inference = got[r].get("inference")
        outs = inference.outputs if inference is not None else None
        if outs is not None:
            if len(outs) != len(e32.outputs):
                per_rank[r].append(f"rank {r}: inference: {len(outs)} outputs where eager has {len(e32.outputs)}")
            for i, (o, x32, x64) in enumerate(zip(outs, e32.outputs, e64.outputs, strict=False)):
                if rec.batch is not None and x32.dim() and x32.shape[0] == rec.batch[2]:
                    lo, size = rec.batch[0], rec.batch[1]
                    x32, x64 = x32[lo:lo + size], x64[lo:lo + size]
                judge(r, f"inference: output {i}", o, x32.contiguous(), x64.contiguous())
    for r in folders:
        problems, tally = per_rank[r], counted[r]
        outcome.entries[r] = VerificationEntry(
            status="mismatch" if problems else "match", compared=tally.run,
            inputs=f"the saved inputs of all {record.world_size} ranks, run together over gloo "
                   f"({rank_threads(record.world_size)} threads each)",
            problems=[p[:300] for p in problems[:20]] or None,
            graph_digests={key: ran.digests for key, ran in sorted(got[r].items())})
        unjudged = len(problems) - tally.failed  # a gradient missing, or one eager does not have
        outcome.totals[r] = CheckTotals(run=tally.run + unjudged, passed=tally.passed, failed=len(problems), skipped=0,
                                        exact=tally.exact, floor=tally.floor, fp64=tally.fp64)
        outcome.problems.extend(problems)
        outcome.compared += tally.run
    outcome.seconds = time.perf_counter() - start
    return outcome


# ---------------------------------------------------------------------------------------
# Replay: every rank again, compared with the digests the check recorded


@dataclass
class RankReplay:
    """One rank's graph replayed with its peers: match (every output bit for bit as the check at
    capture gave it), mismatch (`detail` says which), or ran (nothing recorded to compare with)."""

    rank: int
    key: str
    status: str
    detail: str = ""


def sibling_ranks(folder: Path, who: str = "--ranks") -> tuple[dict[int, Path], DistributedRecord]:
    """Every rank of the world the rank artefact `folder` belongs to: `<name>.rank<r>` beside it.
    `who` (what needs them) begins the errors' fixes."""
    rec = load(folder).manifest.distributed
    if rec is None:
        raise ArtifactError(f"{folder}: not a rank of a distributed model (its manifest has no distributed "
                            f"record); {who} runs those")
    suffix = f".rank{rec.rank}"
    if not folder.name.endswith(suffix):
        raise ArtifactError(f"{folder}: rank {rec.rank}'s folder is named <model>{suffix}; {who} finds the other "
                            "ranks beside it by that name")
    base = folder.name[: -len(suffix)]
    folders = {r: folder.parent / f"{base}.rank{r}" for r in range(rec.world_size)}
    for r, f in folders.items():
        if not (f / "manifest.json").is_file():
            raise ArtifactError(f"{f}: missing; {who} runs all {rec.world_size} ranks of the world together, and "
                                f"finds rank {r} beside {folder.name}")
        other = load(f).manifest.distributed
        if other is None or other.rank != r or (other.world_size, other.strategy, other.mesh) != \
                (rec.world_size, rec.strategy, rec.mesh):
            raise ArtifactError(f"{f}: not rank {r} of {folder.name}'s world ({rec.strategy}, {rec.world_size} ranks, "
                                f"mesh {rec.mesh})")
    return folders, rec


def replay_ranks(folder: Path, timeout: float | None = None) -> list[RankReplay]:
    """The world of the rank artefact `folder` replayed: every rank's graphs run together over gloo
    on their saved inputs, each graph's outputs compared with the digests the check recorded."""
    folders, rec = sibling_ranks(folder)
    got = run_ranks(folders, rec, timeout, own_capture=False)
    out = []
    threads = rank_threads(rec.world_size)
    for r, f in folders.items():
        entry = (load(f).manifest.verification or {}).get(RANKS_KEY)
        recorded = entry.graph_digests if entry is not None and entry.graph_digests is not None else {}
        for key, ran in sorted(got[r].items(), key=lambda kv: key_order(kv[0])):
            want = recorded.get(key)
            if want is None:
                out.append(RankReplay(r, key, "ran", "no digests recorded to compare with"))
            elif want == ran.digests:
                out.append(RankReplay(r, key, "match", f"{len(want)} outputs bit for bit"))
            else:
                differ = [i for i, (a, b) in enumerate(zip(want, ran.digests, strict=False)) if a != b]
                differ += list(range(min(len(want), len(ran.digests)), max(len(want), len(ran.digests))))
                out.append(RankReplay(r, key, "mismatch", f"{len(differ)} of {len(want)} outputs differ from the "
                                      f"capture's run (outputs {', '.join(map(str, differ[:5]))}; at {threads} "
                                      "threads each: on another machine or thread count, the float64 check the "
                                      "capture made is what holds)"))
    return out


# ---------------------------------------------------------------------------------------
# One rank's process


def remap_groups(gm: torch.fx.GraphModule, recorded: dict[str, Any], live: dict[str, str]) -> None:
    """Point each collective at this process's group of the mesh dimension the capture's group
    name stood for (the names match when the mesh was set up in the same order)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.args and isinstance(node.args[-1], str) and node.args[-1] in recorded:
            node.args = (*node.args[:-1], live[recorded[node.args[-1]].dim])
    gm.recompile()


def rank_record(art: Any, folder: Path, rank: int, world: int) -> DistributedRecord:
    """In a rank's process: its loaded artefact's distributed record, which must say it is rank
    `rank` of a world of `world` (else the process exits naming the folder)."""
    rec = art.manifest.distributed
    if rec is None or rec.rank != rank or rec.world_size != world:
        raise SystemExit(f"{folder}: not rank {rank} of a world of {world} (its manifest's distributed record)")
    return rec


def _rank_main(folder: Path, rank: int, world: int, out: Path, own_capture: bool = True) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    art = load(folder, own_capture=own_capture)
    rec = rank_record(art, folder, rank, world)
    with joined(rec, rank) as live:
        result: dict[str, Any] = {}
        for ga in art.graphs.values():
            if isinstance(ga.module, torch.fx.GraphModule):
                remap_groups(ga.module, rec.groups, live)
        if "inference" in art.graphs:
            ga = art.graphs["inference"]
            outs = run_graph(ga.module, ga.saved_inputs())
            result["inference"] = {"outputs": [o for o in outs if isinstance(o, torch.Tensor)], "digests": _digests(outs)}
        if "joint" in art.graphs:
            ga = art.graphs["joint"]
            outs = run_graph(ga.module, ga.saved_inputs())
            result["joint"] = {**_loss_and_grads(ga.record.outputs, outs), "digests": _digests(outs)}
        if "forward" in art.graphs:
            fw = art.graphs["forward"]
            fw_out = run_graph(fw.module, fw.saved_inputs())
            result["forward"] = {"loss": _loss(fw.record.outputs, fw_out), "digests": _digests(fw_out)}
            if "backward" in art.graphs:
                bw = art.graphs["backward"]
                outs = run_graph(bw.module, bw.saved_inputs(fw_out))
                result["backward"] = {**_loss_and_grads(bw.record.outputs, outs), "digests": _digests(outs)}
        dist.barrier()
        torch.save(result, out)


def _digests(outs: list[Any]) -> list[str | None]:
    return [digest(o) if isinstance(o, torch.Tensor) else None for o in outs]


def _loss(records: list[Any], outs: list[Any]) -> torch.Tensor:
    return next(o for r, o in zip(records, outs, strict=True) if r.role == "user")


def _loss_and_grads(records: list[Any], outs: list[Any]) -> dict[str, Any]:
    pairs = list(zip(records, outs, strict=True))
    grads = {r.target: o for r, o in pairs if r.role == "grad" and r.target and isinstance(o, torch.Tensor)}
    users = [o for r, o in pairs if r.role == "user"]
    return {"loss": users[0] if users else None, "grads": grads}


def main(argv: list[str] | None = None) -> int:
    folder, rank, world, out, loaded = (argv if argv is not None else sys.argv[1:])
    _rank_main(Path(folder), int(rank), int(world), Path(out), own_capture=loaded == "own")
    return 0


def exit_rank(code: int) -> NoReturn:
    """End a rank's process (spawn_world's) once its results are saved and its process group
    destroyed, without the interpreter's teardown: there a C++ thread of the collectives'
    runtime, still joinable at static destruction, aborted a finished rank once in a loaded
    suite ("terminate called without an active exception"), failing a world whose results
    were all written. A rank that raises never gets here: its traceback and exit status stand."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_rank(main())
