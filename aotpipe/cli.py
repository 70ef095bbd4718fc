"""The `aotpipe` command: parse arguments, call the library, print. Nothing else."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from typing import Any, Callable

import click

from aotpipe.corpus import opcov
from aotpipe.corpus.diff import diff_paths
from aotpipe.corpus.inspect import describe_lines, list_artifacts
from aotpipe.errors import AotpipeError, LimitError, printable
from aotpipe.format import records
from aotpipe.format.folders import is_graph_folder, is_model_folder, model_folder
from aotpipe.format.limits import Breach, override, parse_bytes
from aotpipe.format.records import json_schema as artifact_schema
from aotpipe.format.vocabulary import ModelStatus
from aotpipe.pipeline import views
from aotpipe.pipeline.config import json_schema, load_pipeline
from aotpipe.pipeline.htmlreport import REPORT_HTML, not_ok_lines, write_page
from aotpipe.pipeline.job import collections_paced
from aotpipe.pipeline.merge import NamedPipeline, merge_runs
from aotpipe.pipeline.report import REPORT_MD, RUN_JSON, dump_run, run_record, settled_text
from aotpipe.pipeline.results import why_failed
from aotpipe.pipeline.runner import RunInterrupted, run_pipeline
from aotpipe.pipeline.shards import parse_shard
from aotpipe.trust.sandbox.decide import decide_sandbox
from aotpipe.trust.sandbox.replay import replay_outcome, replay_sandboxed


def _say(line: object, err: bool = False) -> None:
    """Print one line that names files, folders, models or holds anything an artefact
    supplied: control characters (terminal escapes, carriage returns, newlines) and
    non-ASCII characters escaped, so no name can rewrite the terminal, add a line, or pass
    for another."""
    click.echo(printable(str(line), names=True), err=err)


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print an AotpipeError as one line per problem and exit 2; traceback only with -v.

    The command runs with the garbage collector paced as a job is (job.collections_paced):
    replay, bench, report and ops build graphs and records by the million too."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with collections_paced():
                return fn(*args, **kwargs)
        except AotpipeError as e:
            ctx = click.get_current_context()
            if ctx.find_root().params.get("verbose"):
                raise
            for line in e.lines():
                click.echo(f"error: {line}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:  # Ctrl-C (run says what finished itself): the shell's code for SIGINT
            click.echo("interrupted", err=True)
            sys.exit(130)
        except RecursionError:
            # Walking a tree of folders nested past Python's recursion limit (pathlib's rglob
            # recurses): the user's input, not a bug.
            ctx = click.get_current_context()
            if ctx.find_root().params.get("verbose"):
                raise
            where = next((str(v) for k, v in ctx.params.items()
                          if k in ("directory", "artifact", "path", "pipeline") and v), "the input")
            click.echo(f"error: {printable(where, names=True)}: folders nested too deeply to walk (past Python's "
                       f"recursion limit of {sys.getrecursionlimit()}); point aotpipe at a shallower folder", err=True)
            ctx.exit(2)

    return wrapper


def _warn_partial(paths: Any, what: str) -> None:
    """One line on stderr per partial artefact under `paths` (part of its model ran outside its
    graphs): `what` says what that means for the command. Reads manifests only; a path that is
    not a tree of artefacts is left to the command to name."""
    from pathlib import Path

    for p in paths:
        try:
            rows = list_artifacts(Path(p))
        except (AotpipeError, OSError):
            continue
        for r in rows:
            if r.status == "PARTIAL":
                where = str(Path(p) / r.path) if r.path != "." else str(p)
                first = r.outside[0] if r.outside else "see its manifest"
                _say(f"warning: {where} is a partial capture ({first}): {what}", err=True)


def _byte_limit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add --max-bytes: the byte limit (per replay, per tensor) for this command."""

    @functools.wraps(fn)
    def wrapper(*args: Any, max_bytes: str | None = None, **kwargs: Any) -> Any:
        with override(max_bytes=parse_bytes(max_bytes, "--max-bytes") if max_bytes is not None else None):
            return fn(*args, **kwargs)

    return click.option("--max-bytes", metavar="SIZE", default=None,
                        help="Refuse graphs whose inputs (or a rebuilt model) need more memory than this, "
                             "e.g. 8G; default 2G or AOTPIPE_MAX_BYTES.")(wrapper)


def _check_device(name: str) -> None:
    """--device must name a device torch knows and this machine has (a user error otherwise)."""
    import torch  # torch: kept off the torch-free path (every command imports cli)

    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise AotpipeError(f"--device {name!r} is not a device; use cpu, cuda, cuda:N or meta") from None
    if dev.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=dev)
        except Exception as e:  # not compiled with it, no such device, ...
            why = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
            raise AotpipeError(f"--device {name!r} is not available on this machine ({why})") from None


class _Main(click.Group):
    """The command group; `-v`/`--verbose` is taken anywhere on the line (`aotpipe run x.yaml -v`),
    not only before the command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        verbose = [a for a in args[:end] if a in ("-v", "--verbose")]
        if verbose:
            args = ["--verbose"] + [a for a in args[:end] if a not in ("-v", "--verbose")] + args[end:]
        return super().parse_args(ctx, args)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors (anywhere on the line).")
@click.version_option(package_name="aotpipe")
def main(verbose: bool) -> None:
    """aotpipe: capture, save and check ahead-of-time FX graphs of PyTorch models."""


@main.command(short_help="Capture a pipeline's models into graph artefacts.")
@click.argument("pipeline", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(file_okay=False), help="Output folder (overrides the YAML's output).")
@click.option("--only", multiple=True, metavar="NAME", help="Run only this model (repeatable).")
@click.option("--executor", type=click.Choice(["process", "local", "ray"]), default=None,
              help="Where models run: process (isolated worker processes; the default), local (this process), "
                   "ray (Ray tasks). Overrides the YAML's executor.kind.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Models run at once by the process executor (overrides executor.workers).")
@click.option("--force", is_flag=True, help="Redo models even if their artefacts are up to date.")
@click.option("--shard", metavar="I/N", default=None,
              help="Run only shard I of N: a deterministic, balanced share of the models (every shard computes "
                   "the same partition on its own); combine the shards' outputs with `aotpipe merge`.")
@click.option("--shard-times", type=click.Path(dir_okay=False), default=None, metavar="RUN_JSON",
              help="Balance the shards by the model times in this run.json (give every shard the same file, "
                   "e.g. the last merged run.json); default: a stable estimate from the pipeline alone.")
@click.option("--json", "as_json", is_flag=True, help="Print run.json to stdout instead of a summary.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option("--key", "key", metavar="[ed25519:|hmac:]FILE", default=None, envvar="AOTPIPE_SIGNING_KEY",
              help="Sign every artefact written with this key (an Ed25519 private key, or an HMAC secret); "
                   "an artefact on disk is then kept only if its signature checks. Default: $AOTPIPE_SIGNING_KEY, "
                   "else your own key (made on first use in your config folder: aotpipe trust key).")
@click.option("--no-sign", is_flag=True,
              help="Write unsigned artefacts: replay, bench and export then treat them as made elsewhere.")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 although some model is partial (part of it ran outside its graphs: dynamo's graph "
                   "breaks); without it such a model makes the run exit 1, as a failed one does.")
@_user_errors
def run(pipeline: str, output: str | None, only: tuple[str, ...], executor: str | None, workers: int | None,
        force: bool, shard: str | None, shard_times: str | None, as_json: bool, no_progress: bool,
        key: str | None, no_sign: bool, allow_partial: bool) -> None:
    """Capture every model of PIPELINE into graph artefacts.

    \b
    Examples:
      aotpipe run pipelines/quickstart.yaml
      aotpipe run pipelines/families.yaml --only lstm -v
      aotpipe run pipelines/zoo-hf.yaml --shard 2/4 -o out/shard-2
    """
    if shard_times is not None and shard is None:
        raise AotpipeError("--shard-times balances shards: give --shard I/N with it, or leave it out")
    which = parse_shard(shard) if shard is not None else None

    p = load_pipeline(pipeline, check_sources=False)  # those of models to run, by run_pipeline
    if (executor or p.executor.kind) == "ray" and p.executor.recycle_memory_gb is not None:
        click.echo(f"note: {pipeline}: executor.recycle_memory_gb is not applied with the Ray executor (Ray "
                   "reuses its workers as it sees fit); max_models_per_worker is (Ray's max_calls)", err=True)
    # With --json, stdout is run.json alone: whatever a model or a library prints meanwhile
    # (Ray's worker-death notices, say) goes to stderr.
    try:
        with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
            result = run_pipeline(p, output=output, only=only, progress=not no_progress and not as_json, force=force,
                                  key=key or None, executor=executor, workers=workers, shard=which,
                                  shard_times=shard_times, sign=not no_sign, allow_partial=allow_partial)
    except RunInterrupted as e:
        _interrupted(e, as_json)
    if as_json:
        click.echo((result.output / RUN_JSON).read_text())
    else:
        _model_lines(result.models)
        n_ok = sum(m.status == ModelStatus.OK for m in result.models)
        n_partial = sum(m.status == ModelStatus.PARTIAL for m in result.models)
        of = f" (shard {which} of {len(result.shard.selection)} models)" if which and result.shard else ""
        partial = "" if not n_partial else f", {n_partial} partial" + (
            " (allowed)" if allow_partial else " (exit 1; --allow-partial accepts them)")
        click.echo(f"{n_ok}/{len(result.models)} models ok{partial}{of} in {result.seconds:.1f}s -> {result.output}/ "
                   f"(see {REPORT_MD}, {REPORT_HTML})")
    sys.exit(0 if result.ok else 1)


def _interrupted(e: RunInterrupted, as_json: bool) -> None:
    """Ctrl-C in `run`: what finished and what did not, on stderr with --json; exit 130."""
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        _model_lines(e.done)
        counts = ", ".join(f"{n} {what}" for what, n in (
            ("ok", sum(m.status == ModelStatus.OK for m in e.done)), ("partial", sum(m.status == ModelStatus.PARTIAL for m in e.done)),
            ("failed", sum(m.status == ModelStatus.FAILED for m in e.done))) if n)
        left = "".join(f"; {what}: {', '.join(names)}" for what, names in (
            ("stopped part way", e.stopped), ("not run", e.not_run)) if names)
        _say(f"interrupted: {len(e.done)}/{len(e.done) + len(e.stopped) + len(e.not_run)} models finished"
             f"{f' ({counts})' if counts else ''}{left}. What finished is kept (run.json and the reports are not "
             "rewritten); run the same command again to finish: finished models are up to date and kept")
    sys.exit(130)


def _model_lines(models: list[Any]) -> None:
    """One line per model result of a run: ok, kept, PARTIAL or FAILED."""
    for m in models:
        if m.status == ModelStatus.OK:
            kinds = ", ".join(f"{g.kind}({g.nodes})" for g in m.graphs)
            c = m.checks
            checks = f"{c.passed if c else 0}/{c.run if c else 0} checks" + (
                f" ({settled_text(c)})" if settled_text(c) else "") + (
                f", {c.skipped} SKIPPED" if c is not None and c.skipped else "")
            if m.skipped:
                click.echo(f"kept    {m.name:<24} up to date  {checks}  {kinds}")
            else:
                click.echo(f"ok      {m.name:<24} {m.total_seconds:6.2f}s  {checks}  {kinds}")
            if m.sizes:
                click.echo(f"        {m.name:<24} sizes: {m.sizes}")
            for sp in m.skipped_passes:  # optional passes that failed: the chain went on without them
                also = f" (and {', '.join(sp.left_out)}, which need it)" if sp.left_out else ""
                click.echo(f"        {m.name:<24} {sp.error}; left out{also}: the {sp.graph} graph got "
                           + (f"{sp.graph}.{sp.chain}" if sp.chain else "no pass"))
            if m.traceback and click.get_current_context().find_root().params.get("verbose"):
                click.echo(m.traceback, err=True)
        elif m.status == ModelStatus.PARTIAL:
            when = "up to date" if m.skipped else f"{m.total_seconds:6.2f}s"
            click.echo(f"PARTIAL {m.name:<24} {when}  part of the model ran outside its graphs: "
                       + "; ".join(m.outside_graphs or ["see its manifest's capture.outside_graphs"]))
        else:
            click.echo(f"FAILED  {m.name:<24} {m.stage}: {m.error}")
            if click.get_current_context().find_root().params.get("verbose") and m.traceback:
                click.echo(m.traceback, err=True)


@main.command(short_help="Merge shard output trees into one run.json and report.")
@click.argument("folders", nargs=-1, required=True, type=click.Path())
@click.option("--output", "-o", type=click.Path(file_okay=False), default=None,
              help="Write the merged tree here (DIR/<pipeline>/: the models' folders, hard-linked where the "
                   "filesystem allows, run.json, report); without it, only check and print.")
@click.option("--json", "as_json", is_flag=True, help="Print the merged run.json to stdout instead of a summary.")
@_user_errors
def merge(folders: tuple[str, ...], output: str | None, as_json: bool) -> None:
    """Merge the output trees of `aotpipe run --shard I/N` into one run.

    Names the models no shard ran (missing) and those two shards ran (duplicated). Exit 0:
    every model present once and ok; 1: a model failed, missing or duplicated (the merged
    tree is still written); 2: the folders are not shards of one pipeline run one way.

    \b
    Examples:
      aotpipe merge out/shard-1 out/shard-2 out/shard-3 out/shard-4 -o out/all
      aotpipe merge out/shard-*            # check only: what is missing, what failed
    """
    from pathlib import Path

    result = merge_runs([Path(f) for f in folders], Path(output) if output is not None else None)
    info = result.merge
    assert info is not None  # merge_runs always records what it merged
    if as_json:
        click.echo(dump_run(run_record(result, NamedPipeline(result.pipeline))))  # type: ignore[arg-type]
    else:
        for s in info.shards:
            _say(f"shard {s.shard or '-':<7} {s.models:4d} model(s)  {s.folder}")
        for m in result.models:
            if m.status == ModelStatus.PARTIAL:
                _say(f"PARTIAL {m.name:<24} " + "; ".join(m.outside_graphs or ["part of it ran outside its graphs"]))
            elif m.status != ModelStatus.OK:
                _say(f"FAILED  {m.name:<24} {m.stage}: {m.error}")
        if info.missing:
            _say(f"MISSING {len(info.missing)} model(s) in no shard: {', '.join(info.missing)}")
        for d in info.duplicated:
            _say(f"DUPLICATED {d.name}: in {', '.join(d.folders)} (kept the first)")
        n_ok = sum(m.status == ModelStatus.OK for m in result.models)
        total = len(result.models) + len(info.missing)
        where = f" -> {result.output}/ (see {REPORT_MD})" if output is not None else " (nothing written: no --output)"
        _say(f"{n_ok}/{total} models ok across {len(info.shards)} shard(s){where}")
    sys.exit(0 if result.ok else 1)


@main.command(short_help='Check a pipeline file without capturing.')
@click.argument("pipeline", type=click.Path(dir_okay=False))
@_user_errors
def validate(pipeline: str) -> None:
    """Check PIPELINE without tracing anything: print ok, or every error.

    \b
    Examples:
      aotpipe validate pipelines/quickstart.yaml
    """
    p = load_pipeline(pipeline)
    click.echo(f"ok: {pipeline}: pipeline {p.name!r}, {len(p.models)} model(s)")


@main.command(short_help='Print the JSON Schema of the YAML or the artefacts.')
@click.option("--artifact", is_flag=True,
              help="The artefact format instead: manifest.json, inputs.json, trace.json, graph.json, signature.json.")
def schema(artifact: bool) -> None:
    """Print the JSON Schema of the pipeline YAML (or with --artifact, of the artefact format).

    \b
    Examples:
      aotpipe schema > aotpipe.schema.json
    """
    if artifact:
        click.echo(json.dumps(artifact_schema(), indent=2, sort_keys=True))
        return

    click.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


@main.command(short_help="Replay an artefact's graphs and compare.")
@click.argument("path", type=click.Path(exists=True))
@click.option("--graph", "graphs", multiple=True, metavar="KIND",
              help="Replay only this graph (repeatable): inference, forward, backward, joint, a later dynamo "
                   "subgraph's (forward_1), or a transformed graph such as inference.freeze+fold_conv_bn; "
                   "default: all.")
@click.option("--inputs", type=click.Choice(["saved", "random"]), default="saved", show_default=True,
              help="Saved example inputs (compared with saved outputs) or random ones from get_inputs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --inputs random.")
@click.option("--device", default=None, help="Run on this device (cuda, meta, ...): inputs and factory ops move.")
@click.option("--bench", type=click.IntRange(min=0), default=0, help="Also time N runs (median), beside eager's.")
@click.option("--chain", is_flag=True, help="Also run forward then backward and check gradients vs joint and eager.")
@click.option("--steps", type=click.IntRange(min=0), default=0, metavar="N",
              help="Also run the train_step graph N times in a row, each step fed the parameters, buffers and "
                   "optimizer state the last one gave; with --steps 3 and saved inputs, compared bit for bit "
                   "with the capture's own three chained steps.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Intra-op threads to run at; default: the count the artefact was recorded at (its manifest's "
                   "environment). At another count, outputs are judged by their evidence, not their digests.")
@click.option("--trust-code", is_flag=True,
              help="Import module.py instead of rebuilding from graph.json, and let --bench/--chain rebuild "
                   "a module:callable or hf: source the manifest names (both run code the artefact names); "
                   "builtin zoo models are rebuilt without it.")
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]",
              help="Run ops of this library namespace (repeatable), if the artefact's pipeline trusted it too "
                   "(trusted_ops): imports the module the manifest names, if it lies in package NS, or "
                   "MODULE. Without it, a graph that calls such an op is refused.")
@click.option("--key", "key", default=None, metavar="KEY",
              help="A key you trust (as verify --key takes it): an artefact signed with it, and unchanged "
                   "since, replays in this process; any other runs in the sandbox.")
@click.option("--no-sandbox", is_flag=True, envvar="AOTPIPE_NO_SANDBOX",
              help="Replay in this process without the sandbox: only for artefacts you made yourself or "
                   "otherwise trust (a hostile graph can crash or corrupt this process). Default: "
                   "$AOTPIPE_NO_SANDBOX.")
@click.option("--sizes", default=None, metavar="DIM=N[,DIM=N]", callback=lambda ctx, param, v: _parse_sizes(v),
              help="Replay a shape-polymorphic artefact at these sizes (named dimensions, e.g. batch=7,seq=33; "
                   "the others at the example's): compared with the capture's size check at those sizes, if "
                   "it made one; else the graphs run and their output shapes are checked.")
@click.option("--ranks", is_flag=True,
              help="A distributed model's rank (<model>.rank<r>): replay every rank of its world together, one "
                   "local process per rank over gloo, each graph compared with the outputs the capture's check "
                   "recorded. Runs outside the sandbox: only artefacts you made or signed (--key).")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@_user_errors
@_byte_limit
def replay(path: str, graphs: tuple[str, ...], inputs: str, seed: int, device: str | None, bench: int,
           chain: bool, steps: int, threads: int | None, trust_code: bool, trust_ops: tuple[str, ...],
           key: str | None, no_sandbox: bool, sizes: dict[str, int] | None, ranks: bool, as_json: bool) -> None:
    """Replay the graphs of the artefact at PATH and compare with what was recorded.

    The graphs run in a sandboxed worker (bubblewrap: no network, a read-only filesystem,
    memory and CPU limits), unless the artefact is signed by --key or --no-sandbox is given.

    \b
    Examples:
      aotpipe replay artifacts/quickstart/mlp
      aotpipe replay artifacts/quickstart/mlp --graph forward --chain
      aotpipe replay artifacts/quickstart/mlp --threads 1
      aotpipe replay artifacts/quickstart-dynamic/mlp --sizes batch=7
      aotpipe replay artifacts/quickstart-train/mlp --graph train_step --steps 3
    """
    from pathlib import Path

    if sizes is not None and (bench or chain or steps):
        raise click.UsageError("--sizes replays the graphs alone: --bench, --chain and --steps run at the example "
                               "sizes; drop one or the other")
    p = Path(path)
    _artefact_folder(p)
    if ranks:
        _replay_ranks(p, key=key, no_sandbox=no_sandbox, as_json=as_json,
                      others=bool(graphs or inputs != "saved" or device or bench or chain or steps or threads or sizes))
        return
    failed = _failed_at_capture(model_folder(p))
    opts: dict[str, Any] = dict(graphs=graphs, inputs=inputs, seed=seed, device=device, bench=bench, chain=chain,
                                threads=threads, trust_code=trust_code, trust_ops=trust_ops, sizes=sizes, steps=steps)
    decision = decide_sandbox([p], key=key, no_sandbox=no_sandbox)
    in_process = decision.in_process
    if decision.why and key is not None:  # without --key, the sandbox is simply the default
        _say(f"note: not signed by {key}, so replayed in the sandbox: {decision.why}", err=True)
    try:
        if in_process:
            if device is not None:
                _check_device(device)
            outcome = replay_outcome(p, **opts)
        else:
            outcome = replay_sandboxed(p, **opts)
    except AotpipeError as e:
        if not failed:
            raise
        raise AotpipeError(f"{path}: this artefact FAILED when captured ({failed}); fix the model or pipeline and "
                           f"run it again (replay stopped at: {e})") from e
    if failed:
        _say(f"note: this artefact FAILED when captured: {failed}", err=True)
    results, chained, no_eager, ok = outcome.graphs, outcome.chain, outcome.no_eager, outcome.ok
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2, sort_keys=True))
    else:
        for n in outcome.notes:
            _say(f"note: {n}")
        width = max([10] + [len(r.kind) for r in results])
        for r in results:
            line = f"{r.kind:<{width}} {r.verdict:<9} ({r.inputs} inputs)"
            worst = r.worst()
            if worst is not None and r.status == "close":
                line += f"  {worst.line()}"
            elif r.status == "close" and r.bit_identical:
                line += "  bit-identical"
            elif r.max_abs_error is not None:  # element-wise, over the elements compared (see the lines below)
                line += f"  max abs error {r.max_abs_error:.3g}"
            if r.status == "ran" and r.shapes:
                line += f"  {_output_shapes(r.shapes)}"
            line += f"  {r.seconds * 1e3:.2f} ms"
            if r.bench_seconds is not None:
                line += f"  median of {bench}: {r.bench_seconds * 1e3:.3f} ms"
                if r.eager_bench_seconds is not None:
                    what = "model" if r.kind.startswith("inference") else \
                        "training step" if r.kind.startswith("train_step") else "fwd+bwd"
                    line += f" (eager {what}: {r.eager_bench_seconds * 1e3:.3f} ms)"
            _say(line)
            for m in r.mismatches:
                _say(f"    {m}")
            if r.first_divergence:
                _say(f"    first diverging node: {r.first_divergence}")
            if r.error:
                _say(f"    error: {r.error}")
        if chained is not None:
            eager = ("" if chained.max_abs_error_vs_eager is None
                     else f", vs eager autograd max abs error {chained.max_abs_error_vs_eager:.3g}")
            _say(f"{'chain':<{width}} {chained.status:<9} forward -> backward, {chained.compared} gradients "
                       f"vs joint max abs error {chained.max_abs_error_vs_joint:.3g}{eager}")
            for m in chained.problems:
                _say(f"    {m}")
        if outcome.steps is not None:
            st = outcome.steps
            said = {"match": f"the outputs after step {st.steps} equal the capture's bit for bit ({st.compared})",
                    "mismatch": f"{len(st.differing)} of {st.compared} outputs differ from the capture's after "
                                f"step {st.steps}: {', '.join(st.differing[:5])}"}.get(st.status, st.why or "")
            losses = ", ".join(f"{x:.6g}" for x in st.losses)
            _say(f"{'steps':<{width}} {st.status:<9} {st.steps} chained, loss per step: {losses}; {said}")
        if no_eager:
            _say(f"note: no eager comparison: {no_eager}", err=True)
    sys.exit(0 if ok else 1)


def _replay_ranks(p: Any, *, key: str | None, no_sandbox: bool, as_json: bool, others: bool) -> None:
    """`replay --ranks`: every rank of a distributed model's world run together (checks/distributed.py)."""
    from aotpipe.checks.distributed import replay_ranks, sibling_ranks  # torch

    if others:
        raise click.UsageError("--ranks replays every rank's graphs on their saved inputs as the capture's check ran "
                               "them; drop --graph, --inputs, --device, --bench, --chain, --steps, --threads and --sizes")
    folders, _ = sibling_ranks(model_folder(p))
    decision = decide_sandbox(list(folders.values()), key=key, no_sandbox=no_sandbox)
    if not decision.in_process:
        raise AotpipeError(f"{p}: --ranks runs the ranks in local processes over gloo, outside the sandbox, and these "
                           f"artefacts are not ones you made or signed ({decision.why}); replay one rank alone in "
                           "the sandbox, or pass --key with the key that signed them")
    results = replay_ranks(model_folder(p))
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in results], indent=2, sort_keys=True))
    else:
        width = max(len(r.key) for r in results) if results else 9
        for r in results:
            _say(f"rank{r.rank:<3} {r.key:<{width}} {r.status:<9} {r.detail}")
    sys.exit(1 if any(r.status == "mismatch" for r in results) else 0)


def _parse_sizes(value: str | None) -> dict[str, int] | None:
    """--sizes `name=N[,name=N]` as {name: N}; a usage error naming the fix otherwise."""
    if value is None:
        return None
    out: dict[str, int] = {}
    for part in value.split(","):
        name, eq, size = part.strip().partition("=")
        if not eq or not name.strip() or not size.strip().isdigit():
            raise click.BadParameter(f"{part.strip()!r} is not DIM=N; write e.g. --sizes batch=7,seq=33")
        if name.strip() in out:
            raise click.BadParameter(f"{name.strip()} is given twice; give each dimension once")
        out[name.strip()] = int(size)
    return out


def _output_shapes(shapes: list[list[int] | None]) -> str:
    """The first outputs' shapes, for a replay at other sizes: "outputs [7, 10], [7, 64], ... (9)"."""
    tensors = [s for s in shapes if s is not None]
    shown = ", ".join(str(s) for s in tensors[:3])
    return f"outputs {shown}{f', ... ({len(tensors)})' if len(tensors) > 3 else ''}"


def _artefact_folder(p: Any) -> None:
    """Refuse, in one line, a folder that holds artefacts rather than being one (a pipeline's output)."""
    from aotpipe.trust.verify import find_artifacts  # cryptography: only when used

    if not p.is_dir() or is_model_folder(p) or is_graph_folder(p):
        return
    models, _ = find_artifacts(p)
    if models:
        raise AotpipeError(f"{p} is not an artefact folder; pass a model folder such as {models[0]}")


@main.command(short_help="Check artefacts' files: hashes, format, loading.")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the problems as JSON.")
@click.option("--key", "key", metavar="[ed25519:|hmac:]FILE", default=None,
              help="Check each artefact's signature (signature.json) with this key first: an Ed25519 public "
                   "or private key (PEM, DER, OpenSSH; with ed25519: also raw 32 bytes), or an HMAC secret. "
                   "An artefact whose signature fails is not read further.")
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]",
              help="Run ops of this library namespace (repeatable), if the artefact's pipeline trusted it too "
                   "(trusted_ops): imports the module the manifest names, if it lies in package NS, or "
                   "MODULE. Without it, a graph that calls such an op is refused.")
@_user_errors
@_byte_limit
def verify(directory: str, as_json: bool, key: str | None, trust_ops: tuple[str, ...]) -> None:
    """Check every artefact under DIRECTORY: hashes, format version, safe loading, module.py.

    Without --key this catches corruption, not forgery (a forger can recompute hashes).

    \b
    Examples:
      aotpipe verify artifacts/quickstart
    """
    from pathlib import Path

    from aotpipe.artifact.load import parse_trust  # torch: kept off the torch-free path
    from aotpipe.trust.verify import verify_tree  # cryptography: only when used

    parse_trust(trust_ops)  # a malformed --trust-ops is the user's error, once
    results = verify_tree(Path(directory), key or None, trust_ops=trust_ops)
    if not results:  # a mistyped path must not pass a CI step
        raise _no_artefacts(directory, "checked")
    bad = {str(k): v for k, v in results.items() if v}
    if as_json:
        click.echo(json.dumps({"checked": len(results), "problems": bad}, indent=2, sort_keys=True))
    else:
        for folder, problems in results.items():
            if problems:
                _say(f"FAILED  {folder}")
                for p in problems:
                    _say(f"    {p}")
            else:
                failed = _failed_at_capture(folder)
                _say(f"ok      {folder}" + (f"  (files intact; the artefact itself FAILED when captured: "
                                           f"{failed})" if failed else ""))
        click.echo(f"{len(results) - len(bad)}/{len(results)} artefacts ok (integrity: hashes, format, safe loading, "
                   "module.py; `aotpipe show` says how each checked when captured)")
    breaches = any(isinstance(p, Breach) for problems in results.values() for p in problems)
    sys.exit(2 if breaches else 1 if bad else 0)


def _no_artefacts(directory: str, done: str) -> AotpipeError:
    """The one error of ls, verify and sign for a folder with no artefact under it (exit 2)."""
    return AotpipeError(f"{directory}: no artefacts found (looked for manifest.json in it and every folder below); "
                        f"nothing was {done}: pass a pipeline's output folder or a model folder")


def _failed_at_capture(folder: Any) -> str | None:
    """Why the run that wrote the artefact in `folder` failed it, or None (also when its
    manifest cannot be read: verify has said so)."""
    from pathlib import Path

    try:
        _, manifest = records.read(records.Manifest, Path(folder) / records.MANIFEST)
    except (AotpipeError, OSError):
        return None
    return why_failed(manifest)


@main.command(short_help='Sign every artefact under a folder.')
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--key", "key", metavar="[ed25519:|hmac:]FILE", default=None,
              help="An Ed25519 private key (PEM, DER or OpenSSH), or an HMAC-SHA256 secret of more than 32 bytes, "
                   "whitespace at its ends not counted (never a public key). Default: your own key (aotpipe trust key), "
                   "so that you trust what you signed.")
@_user_errors
def sign(directory: str, key: str | None) -> None:
    """Sign every artefact under DIRECTORY (signature.json beside each manifest.json).

    Each must verify first. Check with: aotpipe verify DIRECTORY --key KEY (the public key
    for Ed25519, the same secret for HMAC). Without --key, signing with your own key says
    you trust these artefacts: replay, bench and export then run them in your process.

    \b
    Examples:
      aotpipe sign artifacts/quickstart --key signing.pem
      aotpipe sign reviewed/colleague-corpus
    """
    from pathlib import Path

    from aotpipe.trust.keyring import own_key  # cryptography: only when used
    from aotpipe.trust.signing import load_key  # cryptography: only when used
    from aotpipe.trust.verify import find_artifacts, sign_artifact  # cryptography: only when used

    key = key or str(own_key())
    k = load_key(key, for_signing=True)
    models, unfinished = find_artifacts(Path(directory))
    failed, breach = 0, False
    for m in models:
        try:
            sign_artifact(m, key)
            _say(f"signed  {m}  ({k.algorithm}, key id {k.key_id})")
        except AotpipeError as e:
            failed += 1
            breach = breach or isinstance(e, LimitError)
            _say(f"FAILED  {m}")
            _say(f"    {e.lines()[0]}")
    for u in unfinished:
        failed += 1
        _say(f"FAILED  {u}")
        _say(f"    {u / 'manifest.json'}: missing (an incomplete artefact)")
    if not models and not unfinished:
        raise _no_artefacts(directory, "signed")
    sys.exit(2 if breach else 1 if failed else 0)


@main.group(short_help="The keys whose artefacts run in your process.")
def trust() -> None:
    """The keys you trust. `aotpipe run` signs with your own key (made on first use); an
    artefact signed by it or by a key added here, and unchanged since, replays, benches and
    exports in your process. Anything else replays in the sandbox and is not benched or
    exported without --no-sandbox.

    \b
    Examples:
      aotpipe trust key -o me.pub            # your public key, for colleagues to add
      aotpipe trust add alice.pub --name alice
      aotpipe trust list
      aotpipe trust remove alice
    """


@trust.command(name="key", short_help="Print (or write) your own public key.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write it to this file.")
@_user_errors
def trust_key(output: str | None) -> None:
    """Your own public key (PEM), made on first use: what a colleague passes to `trust add`."""
    from pathlib import Path

    from aotpipe.trust.keyring import key_id, own_key, public_pem  # cryptography: only when used

    path = own_key()
    pem = public_pem(path)
    if output:
        Path(output).write_bytes(pem)
        _say(f"wrote {output}: the public key of {path} (key id {key_id(path)})")
    else:
        click.echo(pem.decode("ascii"), nl=False)


@trust.command(name="add", short_help="Trust the artefacts an Ed25519 key signs.")
@click.argument("key")
@click.option("--name", default=None, help="What to call it (default: its key id).")
@_user_errors
def trust_add(key: str, name: str | None) -> None:
    """Trust KEY (an Ed25519 public key, or private key whose public half is kept): artefacts
    it signs then run in your process."""
    from aotpipe.trust.keyring import add_trusted, key_id  # cryptography: only when used

    path = add_trusted(key, name)
    _say(f"trusted {path.stem} (key id {key_id(path)}): {path}")


@trust.command(name="list", short_help="List the keys you trust.")
@_user_errors
def trust_list() -> None:
    """Your own key, then the keys you added, with their key ids (signature.json names one)."""
    from aotpipe.trust.keyring import key_id, own_key, trusted_keys  # cryptography: only when used

    own = own_key(create=False)
    for path in trusted_keys():
        label = "(your own)" if path == own else path.stem
        click.echo(f"{key_id(path)}  {printable(label)}  {printable(str(path))}")
    if own is None:
        _say("note: you have no key of your own yet; aotpipe run (or aotpipe trust key) makes one", err=True)


@trust.command(name="remove", short_help="Stop trusting a key you added.")
@click.argument("name")
@_user_errors
def trust_remove(name: str) -> None:
    from aotpipe.trust.keyring import remove_trusted  # cryptography: only when used

    _say(f"removed {remove_trusted(name)}")


@main.command(short_help="Run a compiler backend over every graph of some artefacts.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--backend", required=True, metavar="BACKEND",
              help="eager, aot_eager, inductor, inductor-freezing (inference graphs) or module:callable.")
@click.option("--graphs", metavar="KINDS", default=None, help="Only these kinds, comma-separated (default: all).")
@click.option("--baseline", metavar="FILE", default=None, help="Expected statuses (CSV): exit 1 on any new failure.")
@click.option("--write-baseline", metavar="FILE", default=None, help="Write this bench's statuses as a baseline.")
@click.option("--removed", "removed", multiple=True, metavar="MODEL[/GRAPH]",
              help="With --baseline: this model (or graph), no longer benched, was removed on purpose; repeatable "
                   "(without it, a graph that passed there and is gone is a regression).")
@click.option("--locate", is_flag=True, help="Bisect each failing graph to its first faulty node; write a repro.")
@click.option("--minimize", is_flag=True,
              help="As --locate, then cut each culprit down to the few nodes that still fail: a repro artefact and a "
                   "standalone script.")
@click.option("--locate-dir", metavar="DIR", default=None,
              help="Where --locate and --minimize write repros (default bench-repros).")
@click.option("--json", "as_json", is_flag=True, help="Print the results and scores as JSON.")
@click.option("--csv", "csv_path", metavar="FILE", default=None, help="Write one row per graph to FILE.")
@click.option("--inputs", type=click.Choice(["saved", "random"]), default="saved", show_default=True,
              help="Saved inputs, or random ones like them (used anyway where none were saved).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --inputs random.")
@click.option("--sizes", "sizes", multiple=True, metavar="DIM=N,N,...",
              help="Bench each graph at these sizes of a dynamic dimension (random inputs), compiled once with "
                   "dynamic shapes; repeat for more dimensions (their lists are zipped).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="Per-graph time limit in seconds (compile, check and timing).")
@click.option("--rounds", type=click.IntRange(min=2), default=10, show_default=True, help="Timed rounds per graph.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Intra-op threads of the bench's worker (one: timings that a busy machine does not skew).")
@click.option("--clock", type=click.Choice(["auto", "wall", "cpu"]), default="auto", show_default=True,
              help="Time samples by wall time or by the worker's CPU time; auto: CPU time with one thread, else wall.")
@click.option("--collectives", type=click.Choice(["recorded", "gloo"]), default=None,
              help="A distributed rank's collectives: replaced by the results a run of its world recorded (the "
                   "default; not timed), or executed with its world's ranks in local processes over gloo.")
@click.option("--key", "key", default=None, metavar="KEY", help="Bench artefacts signed with this key.")
@click.option("--no-sandbox", is_flag=True, envvar="AOTPIPE_NO_SANDBOX",
              help="Bench artefacts without a signature check: only ones you made or otherwise trust.")
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]", help="As replay --trust-ops.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@_user_errors
def bench(paths: tuple[str, ...], backend: str, graphs: str | None, baseline: str | None,
          write_baseline: str | None, locate: bool, locate_dir: str | None, as_json: bool, csv_path: str | None,
          inputs: str, seed: int, timeout_s: float, rounds: int, key: str | None, no_sandbox: bool,
          trust_ops: tuple[str, ...], no_progress: bool, threads: int | None,
          clock: str, removed: tuple[str, ...], sizes: tuple[str, ...], collectives: str | None,
          minimize: bool) -> None:
    """Run BACKEND over every graph of every artefact under PATHS: status, speedup, scores.

    \b
    Examples:
      aotpipe bench artifacts/quickstart --backend inductor
      aotpipe bench artifacts/quickstart --backend inductor --baseline benchmarks/baselines/quickstart-inductor.csv
      aotpipe bench artifacts/quickstart --backend tests.bench.backends:gelu_as_relu --locate
      aotpipe bench artifacts/quickstart-dynamic --backend inductor --sizes batch=2,5,8
      aotpipe bench artifacts/distributed/llama_fsdp2_w4.rank0 --backend inductor

    \b
    Run from a clone's root after `aotpipe run pipelines/quickstart.yaml` (which signs
    artifacts/ with your own key); the last, a planted faulty backend, exits 1 naming the node.
    One intra-op thread, timed by CPU time: a speedup is the median of interleaved rounds'
    ratios with its interval, or "within noise" where that interval holds 1.0x.
    --sizes, on an artefact captured with dims: (the last, after `aotpipe run
    pipelines/quickstart-dynamic.yaml`), gives a row per graph and size, and says whether
    the backend recompiled there. A distributed model's rank (after `aotpipe run
    pipelines/distributed.yaml`) is benched with its collectives as --collectives says.
    """
    # torch: kept off the torch-free path (every command imports cli)
    from aotpipe.corpus.bench.command import BenchOptions, run_bench

    _warn_partial(paths, "its graphs are benched, but they are not the whole model")

    sys.exit(run_bench(BenchOptions(paths, backend, graphs, baseline, write_baseline, locate, as_json, csv_path,
                                    inputs, seed, timeout_s, rounds, key, no_sandbox, trust_ops, not no_progress,
                                    locate_dir, threads, clock, removed, sizes, collectives, minimize), _say,
                           click.echo))


@main.command(short_help="Cut each failing graph down to a small standalone repro.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--backend", required=True, metavar="BACKEND",
              help="eager, aot_eager, inductor, inductor-freezing (inference graphs) or module:callable.")
@click.option("--graphs", metavar="KINDS", default=None, help="Only these kinds, comma-separated (default: all).")
@click.option("-o", "--output", "locate_dir", metavar="DIR", default="bench-repros", show_default=True,
              help="Where the repros go.")
@click.option("--json", "as_json", is_flag=True, help="Print the results, repros and bugs as JSON (as bench --json).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="Per-graph time limit in seconds (the check, and each cut's try).")
@click.option("--key", "key", default=None, metavar="KEY", help="Run artefacts signed with this key.")
@click.option("--no-sandbox", is_flag=True, envvar="AOTPIPE_NO_SANDBOX",
              help="Run artefacts without a signature check: only ones you made or otherwise trust.")
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]", help="As replay --trust-ops.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@_user_errors
def minimize(paths: tuple[str, ...], backend: str, graphs: str | None, locate_dir: str, as_json: bool,
             timeout_s: float, key: str | None, no_sandbox: bool, trust_ops: tuple[str, ...],
             no_progress: bool) -> None:
    """Run BACKEND over every graph under PATHS and cut each failing one down to the few nodes
    that still fail the same way: a repro artefact (replayable, benchable) and a standalone
    script beside it, then the failures grouped into bugs. `aotpipe bench --minimize` without
    the timings: each graph is checked once and timed over two rounds only.

    Exit 0: every graph passed (nothing to cut); 1: some failed (each cut down or said why not).

    \b
    Examples:
      aotpipe minimize artifacts/quickstart --backend tests.bench.backends:gelu_as_relu
      aotpipe minimize artifacts/quickstart/mlp --backend inductor -o repros/mlp
    """
    # torch: kept off the torch-free path (every command imports cli)
    from aotpipe.corpus.bench.command import BenchOptions, run_bench

    _warn_partial(paths, "its graphs are cut down, but they are not the whole model")
    sys.exit(run_bench(BenchOptions(paths, backend, graphs, as_json=as_json, timeout_s=timeout_s, rounds=2, key=key,
                                    trusted=no_sandbox, trust_ops=trust_ops, progress=not no_progress,
                                    locate_dir=locate_dir, minimize=True, brief=True), _say, click.echo))


@main.command(short_help="Group a bench's failing graphs into unique bugs.")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the bugs as JSON.")
@_user_errors
def triage(results: str, as_json: bool) -> None:
    """Group the failing graphs of RESULTS (what `aotpipe bench ... --json` printed) into unique
    bugs: a value outside the bound by its culprit node's op and argument kinds (--locate or
    --minimize traced it), any other failure by its status and reason with what varies between
    graphs taken out. One row per bug: graphs and models it hits, first seen, smallest repro.
    Nothing is run. Exit 0 with no bug, 1 with some. Write RESULTS with
    `aotpipe bench ... --minimize --json > bench.json` (bench --minimize prints the same table).

    \b
    Examples:
      aotpipe triage bench.json
      aotpipe triage bench.json --json
    """
    from pathlib import Path

    # why: the bench package imports torch, kept off the torch-free path (every command imports cli)
    from aotpipe.corpus.bench import triage as triage_mod

    bugs = triage_mod.triage(*triage_mod.read(Path(results)))
    if as_json:
        click.echo(json.dumps([b.to_json() for b in bugs], indent=2, sort_keys=True))
    else:
        for line in triage_mod.lines(bugs):
            _say(line)
    sys.exit(1 if bugs else 0)


@main.command(name="ls", short_help='List artefacts and their status.')
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@_user_errors
def ls_cmd(directory: str) -> None:
    """List the artefacts under DIRECTORY with their status.

    \b
    Examples:
      aotpipe ls artifacts
    """
    from pathlib import Path

    rows = list_artifacts(Path(directory))
    if not rows:
        raise _no_artefacts(directory, "listed")
    rows = [dataclasses.replace(r, path=printable(r.path, names=True), status=printable(r.status, names=True),
                                graphs=printable(r.graphs, names=True), size=printable(r.size, names=True),
                                error=None if r.error is None else printable(r.error),
                                outside=tuple(printable(o) for o in r.outside))
            for r in rows]
    width = max(len(r.path) for r in rows)
    for r in rows:
        click.echo(f"{r.path:<{width}}  {r.status:<10} {r.graphs:<36} {r.size}")
        for line in r.outside:  # a partial capture: what its graphs leave out
            click.echo(f"{'':<{width}}  outside the graphs, {line}")
    refused = [r.error for r in rows if r.error]
    for line in refused:
        click.echo(f"error: {line}", err=True)
    if refused:
        sys.exit(2)


@main.command(short_help="Compare two artefacts or two output trees.")
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
@click.option("--threshold", type=click.FloatRange(min=0), default=0.5, show_default=True,
              help="Trees: a model's time or bytes count as changed when one is more than 1 + THRESHOLD "
                   "times the other (times also need to move by 1 s).")
@click.option("--values/--no-values", default=True, show_default=True,
              help="Artefacts: also run both artefacts' graphs on the same inputs and name the first "
                   "diverging node (in the sandbox unless --key or --no-sandbox).")
@click.option("--key", "key", default=None, metavar="KEY",
              help="A key you trust (as verify --key takes it): artefacts both signed with it run in this process.")
@click.option("--no-sandbox", is_flag=True, envvar="AOTPIPE_NO_SANDBOX",
              help="Run the graphs in this process: only for artefacts you made or otherwise trust. "
                   "Default: $AOTPIPE_NO_SANDBOX.")
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]",
              help="Accept ops of this library namespace (as replay --trust-ops).")
@_user_errors
@_byte_limit
def diff(a: str, b: str, as_json: bool, threshold: float, values: bool, key: str | None, no_sandbox: bool,
         trust_ops: tuple[str, ...]) -> None:
    """Compare A and B: two artefacts (model folders) or two output trees (pipeline output
    folders). Exit 0 if they are the same, 1 if they differ, 2 if A or B is not one of those.

    \b
    Examples:
      aotpipe diff artifacts/quickstart/mlp other/quickstart/mlp
      aotpipe diff artifacts/quickstart other/quickstart --json
    """
    result = diff_paths(a, b, threshold=threshold, values=values, in_process=no_sandbox, key=key,
                        trust_ops=trust_ops)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, sort_keys=True, default=str))
    else:
        for line in result.lines():
            _say(line)
    sys.exit(0 if result.same else 1)


@main.command(short_help="Describe one artefact's graphs.")
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]",
              help="Accept ops of this library namespace (as replay --trust-ops).")
@click.option("--graph", default=None, metavar="KEY",
              help="With --model-explorer: only this graph (inference, forward, backward, joint, forward_1, "
                   "inference.freeze+...); default: every graph of the artefact.")
@click.option("--model-explorer", "explorer", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Write the graph(s) to FILE as one model-explorer graph collection (open it with "
                   "`model-explorer FILE`), and the per-node errors against the float64 bound beside it, in FILE "
                   "with .json replaced by .node-data.json; nothing is run.")
@click.option("--model-explorer-all", "explorer_all", is_flag=True,
              help="Write a model-explorer view of every graph of every artefact under ARTIFACT (a model or an "
                   "output tree) to <tree>/views/<model>/<graph>.model-explorer.json; `aotpipe report <tree>` "
                   "then links them from report.html.")
@_user_errors
@_byte_limit
def show(artifact: str, trust_ops: tuple[str, ...], graph: str | None, explorer: str | None,
         explorer_all: bool) -> None:
    """Print an artefact's graphs, node counts, op histogram, inputs and outputs; or write
    them as model-explorer graph views.

    \b
    Examples:
      aotpipe show artifacts/quickstart/small_cnn
      aotpipe show artifacts/quickstart/small_cnn --graph joint --model-explorer joint.json
      aotpipe show artifacts/quickstart --model-explorer-all
    """
    from pathlib import Path

    if explorer or explorer_all:
        if explorer and explorer_all:
            raise AotpipeError("pass --model-explorer FILE or --model-explorer-all, not both")
        if explorer:
            for path in views.write_explorer(Path(artifact), Path(explorer), graph):
                _say(f"wrote {path}")
        else:
            if graph is not None:
                raise AotpipeError("--graph goes with --model-explorer FILE; --model-explorer-all writes every graph")
            written = views.write_tree_views(Path(artifact))
            count = sum(len(v) for v in written.values())
            tree = views.views_tree(Path(artifact))
            _say(f"wrote {count} graph views of {len(written)} models under {tree / views.VIEWS_DIR}")
            _say(f"run `aotpipe report {tree}` to link them from report.html")
        return
    if graph is not None:
        raise AotpipeError("--graph goes with --model-explorer FILE (plain show describes every graph)")

    for line in describe_lines(Path(artifact), trust_ops=trust_ops):
        _say(line)


@main.command(short_help="Rebuild report.html of an output folder from its files.")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write the page here instead of DIRECTORY/report.html.")
@_user_errors
def report(directory: str, output: str | None) -> None:
    """Rebuild DIRECTORY/report.html from what is on disk: run.json, each model's manifest and
    graph.json, and bench.json where a bench has run. Nothing is run: any tree can be read.

    \b
    Examples:
      aotpipe report artifacts/quickstart
      aotpipe report artifacts/quickstart -o /tmp/quickstart.html
    """
    from pathlib import Path

    path, page = write_page(Path(directory), Path(output) if output is not None else None)
    _say(f"wrote {path}")
    for line in not_ok_lines(page):  # exit 0 all the same: the page is written; `aotpipe verify` judges
        _say(line)


def _write_cases(directory: str, cases_dir: str, key: str | None, no_sandbox: bool, as_json: bool) -> int:
    """ops --cases: mine the cases of the tree at `directory`, write them under `cases_dir`; the exit code."""
    from pathlib import Path

    # torch and cryptography: only --cases runs graphs and signs
    from aotpipe.corpus import cases
    from aotpipe.corpus.bench.run import check_trust, find_models  # torch: as above
    from aotpipe.trust.keyring import signing_key_spec  # cryptography: as above

    root, out = Path(directory), Path(cases_dir)
    mined = cases.mine(root)
    check_trust(find_models([root]), None, no_sandbox, "run (ops --cases runs each model's graphs in worker processes, "
                "not the sandbox)")
    cases.write_cases(mined, out, key=signing_key_spec(key))
    if as_json:
        click.echo(json.dumps(cases.summary_json(mined, out), indent=2, sort_keys=True))
    else:
        for line in cases.summary_lines(mined, out):
            _say(line)
    return 2 if mined.problems else 1 if any(c.problem for c in mined.cases) else 0


@main.command(short_help="List the ops of a tree's graphs, and their coverage.")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--supported", "supported", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Supported ops, one per line: aten.addmm.default, aten.addmm (every overload) or aten.* .")
@click.option("--backend", default=None, metavar="NAME",
              help="Supported ops from a backend's own tables: inductor (lowered or decomposed) or core_aten "
                   "(torch.Tag.core). Imports torch; see docs/ops.md.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the op table as CSV.")
@click.option("--cases", "cases_dir", type=click.Path(file_okay=False), default=None, metavar="OUT",
              help="Write one per-op case per distinct (op, argument layouts and values) to OUT, a new folder: "
                   "each an artefact aotpipe bench runs, weighted by the calls it stands for, and every case in "
                   "OUT/cases.jsonl. Runs each model's graphs once (signed ones, as bench).")
@click.option("--key", "key", metavar="[ed25519:|hmac:]FILE", default=None, envvar="AOTPIPE_SIGNING_KEY",
              help="With --cases: sign the cases with this key. Default: $AOTPIPE_SIGNING_KEY, else your own key.")
@click.option("--no-sandbox", is_flag=True, envvar="AOTPIPE_NO_SANDBOX",
              help="With --cases: run graphs without a signature check: only ones you made or otherwise trust.")
@_user_errors
def ops(directory: str, supported: str | None, backend: str | None, as_json: bool, as_csv: bool,
        cases_dir: str | None, key: str | None, no_sandbox: bool) -> None:
    """List every op the graphs under DIRECTORY call: calls, models, graph kinds, input
    signatures (dtype[rank]); with --supported or --backend, the coverage per model and the
    first unsupported op of each graph. Reads graph.json only: nothing is run.

    With --cases OUT, mine per-op cases instead: every call of the tree falls in one case (its
    op, each tensor argument's shape, stride, storage offset and dtype, every other argument),
    and each case that can stand alone is written as an artefact on the values its first call
    took; `aotpipe bench OUT --backend B` gives each op's status and speedup weighted by its
    calls. See docs/ops.md.

    Exit 0: listed (and, with a supported set, every op covered; with --cases, every case that
    can stand alone written); 1: some op not covered, or some case not written; 2: bad input
    (a record that cannot be read is named, the rest still listed).

    \b
    Examples:
      aotpipe ops artifacts/quickstart
      aotpipe ops artifacts/zoo-hf --backend inductor
      aotpipe ops artifacts/zoo-hf --supported my_backend_ops.txt --csv > ops.csv
      aotpipe ops artifacts/quickstart --cases cases/quickstart
    """
    from pathlib import Path

    if supported and backend:
        raise AotpipeError("give --supported FILE or --backend NAME, not both")
    if as_json and as_csv:
        raise AotpipeError("give --json or --csv, not both")
    if cases_dir is not None:
        if supported or backend or as_csv:
            raise AotpipeError("--cases writes cases, not the op table: drop --supported, --backend and --csv")
        sys.exit(_write_cases(directory, cases_dir, key, no_sandbox, as_json))
    check = by = None
    if supported:
        check, by = opcov.supported_from_file(Path(supported)), supported
    elif backend:
        check, by = opcov.supported_by_backend(backend), f"backend {backend}"
    _warn_partial([directory], "the ops that ran outside its graphs are in no graph, so not in this table")
    table = opcov.op_table(Path(directory), check, by)
    if as_json:
        click.echo(json.dumps(opcov.to_json(table), indent=2, sort_keys=True))
    elif as_csv:
        click.echo(opcov.to_csv(table), nl=False)
    else:
        for line in opcov.text_lines(table):
            _say(line)
    for p in table.problems:
        if as_json or as_csv:
            _say(f"error: {p}", err=True)
    uncovered = by is not None and any(not r.supported for r in table.ops)
    sys.exit(2 if table.problems else 1 if uncovered else 0)


@main.command(name="export-pt2", short_help="Write an artefact's inference graph as a torch.export .pt2.")
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True, help="The .pt2 file to write.")
@click.option("--graph", default=None, metavar="KEY",
              help="Which inference graph: inference (the default) or one made by passes, e.g. "
                   "inference.freeze+fold_conv_bn.")
@click.option("--key", "key", default=None, metavar="KEY",
              help="A key you trust: an artefact signed with it, and unchanged since, is exported.")
@click.option("--no-sandbox", "trusted", is_flag=True, envvar="AOTPIPE_NO_SANDBOX",
              help="Export an unsigned artefact (you made it or otherwise trust it): exporting traces and runs "
                   "its graph in this process. Default: $AOTPIPE_NO_SANDBOX.")
@_user_errors
@_byte_limit
def export_pt2(artifact: str, output: str, graph: str | None, key: str | None, trusted: bool) -> None:
    """Write the inference graph of ARTIFACT as a torch.export archive (.pt2) that
    torch.export.load reads and AOTInductor packages; it is loaded back and run on the
    artefact's saved inputs beside the artefact's graph, and must match it.

    Tracing and checking run the graph in this process: the artefact must be signed by
    --key, or trusted with --no-sandbox.

    \b
    Examples:
      aotpipe export-pt2 artifacts/quickstart/small_cnn -o small_cnn.pt2 --no-sandbox
      aotpipe export-pt2 artifacts/quickstart/mlp --graph inference.freeze+fold_conv_bn+channels_last+reinplace -o mlp.pt2 --key pub.pem
    """
    from pathlib import Path

    from aotpipe.corpus.pt2_program import export_pt2 as export  # torch: kept off the torch-free path (cli)

    p = Path(artifact)
    _artefact_folder(p)
    folder = Path(output).parent
    if not folder.is_dir():  # before any work: torch.export.save would fail after it, with a traceback
        above = next((q for q in (folder, *folder.parents) if q.exists()), None)
        if above is not None and not above.is_dir():
            raise AotpipeError(f"-o {output}: {above} is a file, not a folder; choose another path")
        raise AotpipeError(f"-o {output}: the folder {folder} does not exist; make it first (mkdir -p {folder})")
    decision = decide_sandbox([p], key=key, no_sandbox=trusted)
    if not decision.in_process:
        who = key if key is not None else "a key you trust"
        raise AotpipeError(f"not exported (export-pt2 runs the graph in this process, and the artefact is not "
                           f"signed by {who}): {decision.why}; or --no-sandbox if you otherwise trust it")
    r = export(p, Path(output), graph)
    verdict = "identical" if r.identical else f"max abs difference {r.max_abs_difference:.3g}"
    _say(f"wrote {r.path}: {r.graph} graph, {r.user_inputs} inputs, {r.outputs} outputs, {r.parameters} parameters, "
         f"{r.buffers} buffers and constants; loaded back, outputs vs the artefact's graph: {verdict}")
    sys.exit(0 if r.identical else 1)


if __name__ == "__main__":
    main()
