"""The `aotpipe` command: parse arguments, call the library, print. Nothing else."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from typing import Any, Callable

import click

from aotpipe.errors import AotpipeError


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print an AotpipeError as one line per problem and exit 2; traceback only with -v."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AotpipeError as e:
            ctx = click.get_current_context()
            if ctx.find_root().params.get("verbose"):
                raise
            for line in e.lines():
                click.echo(f"error: {line}", err=True)
            ctx.exit(e.exit_code)

    return wrapper


def _byte_limit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add --max-bytes: the byte limit (per replay, per tensor) for this command."""

    @functools.wraps(fn)
    def wrapper(*args: Any, max_bytes: str | None = None, **kwargs: Any) -> Any:
        from aotpipe.artifact.limits import override, parse_bytes

        with override(max_bytes=parse_bytes(max_bytes, "--max-bytes") if max_bytes is not None else None):
            return fn(*args, **kwargs)

    return click.option("--max-bytes", metavar="SIZE", default=None,
                        help="Refuse graphs whose inputs (or a rebuilt model) need more memory than this, "
                             "e.g. 8G; default 2G or AOTPIPE_MAX_BYTES.")(wrapper)


def _check_device(name: str) -> None:
    """--device must name a device torch knows and this machine has (a user error otherwise)."""
    import torch

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
@click.option("--json", "as_json", is_flag=True, help="Print run.json to stdout instead of a summary.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option("--key", "key", type=click.Path(dir_okay=False), default=None, envvar="AOTPIPE_SIGNING_KEY",
              help="Sign every artefact written with this key (an HMAC secret or an Ed25519 PEM private key); "
                   "an artefact on disk is then kept only if its signature checks. Default: $AOTPIPE_SIGNING_KEY.")
@_user_errors
def run(pipeline: str, output: str | None, only: tuple[str, ...], executor: str | None, workers: int | None,
        force: bool, as_json: bool, no_progress: bool, key: str | None) -> None:
    """Capture every model of PIPELINE into graph artefacts.

    \b
    Examples:
      aotpipe run pipelines/quickstart.yaml
      aotpipe run pipelines/families.yaml --only lstm -v
    """
    from aotpipe.config import load_pipeline
    from aotpipe.report import RUN_JSON, REPORT_MD
    from aotpipe.runner import run_pipeline

    p = load_pipeline(pipeline, check_sources=False)  # those of models to run, by run_pipeline
    # With --json, stdout is run.json alone: whatever a model or a library prints meanwhile
    # (Ray's worker-death notices, say) goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        result = run_pipeline(p, output=output, only=only, progress=not no_progress and not as_json, force=force,
                              key=key or None, executor=executor, workers=workers)
    if as_json:
        click.echo((result.output / RUN_JSON).read_text())
    else:
        for m in result.models:
            if m.status == "ok":
                kinds = ", ".join(f"{g.kind}({g.nodes})" for g in m.graphs)
                c = m.checks or {}
                checks = f"{c.get('passed', 0)}/{c.get('run', 0)} checks" + (
                    f", {c['skipped']} SKIPPED" if c.get("skipped") else "")
                if m.skipped:
                    click.echo(f"kept    {m.name:<24} up to date  {checks}  {kinds}")
                else:
                    click.echo(f"ok      {m.name:<24} {m.total_seconds:6.2f}s  {checks}  {kinds}")
            else:
                click.echo(f"FAILED  {m.name:<24} {m.stage}: {m.error}")
                if click.get_current_context().find_root().params.get("verbose") and m.traceback:
                    click.echo(m.traceback, err=True)
        n_ok = sum(m.status == "ok" for m in result.models)
        click.echo(f"{n_ok}/{len(result.models)} models ok in {result.seconds:.1f}s -> {result.output}/ "
                   f"(see {REPORT_MD})")
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
    from aotpipe.config import load_pipeline

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
        from aotpipe.artifact.records import json_schema as artifact_schema

        click.echo(json.dumps(artifact_schema(), indent=2, sort_keys=True))
        return
    from aotpipe.config import json_schema

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
@click.option("--trust-code", is_flag=True,
              help="Import module.py instead of rebuilding from graph.json, and let --bench/--chain rebuild "
                   "a module:callable or hf: source the manifest names (both run code the artefact names); "
                   "builtin zoo models are rebuilt without it.")
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]",
              help="Run ops of this library namespace (repeatable), if the artefact's pipeline trusted it too "
                   "(trusted_ops): imports the module the manifest names, if it lies in package NS, or "
                   "MODULE. Without it, a graph that calls such an op is refused.")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@_user_errors
@_byte_limit
def replay(path: str, graphs: tuple[str, ...], inputs: str, seed: int, device: str | None, bench: int,
           chain: bool, trust_code: bool, trust_ops: tuple[str, ...], as_json: bool) -> None:
    """Replay the graphs of the artefact at PATH and compare with what was recorded.

    \b
    Examples:
      aotpipe replay artifacts/quickstart/mlp
      aotpipe replay artifacts/quickstart/mlp --graph forward --chain
    """
    from pathlib import Path

    from aotpipe.artifact.load import load
    from aotpipe.replay import eager_bench, replay as replay_graphs, replay_chain

    if device is not None:
        _check_device(device)
    p = Path(path)
    _artefact_folder(p)
    failed = _failed_at_capture(p if (p / "manifest.json").exists() else p.parent)
    try:
        art = load(p, trust_code=trust_code, trust_ops=trust_ops)
        kinds = list(graphs)
        if not kinds and (p / "graph.json").exists():
            kinds = [k for k, g in art.graphs.items() if g.folder.resolve() == p.resolve()]
        results = replay_graphs(art, graphs=kinds or None, inputs=inputs, seed=seed, device=device, bench=bench)
    except AotpipeError as e:
        if not failed:
            raise
        raise AotpipeError(f"{path}: this artefact FAILED when captured ({failed}); fix the model or pipeline and "
                           f"run it again (replay stopped at: {e})") from e
    if failed:
        click.echo(f"note: this artefact FAILED when captured: {failed}", err=True)
    if bench:
        for r in results:
            r.eager_bench_seconds = eager_bench(art, r.kind.split(".")[0], bench, trust_code=trust_code)
    chained = replay_chain(art, trust_code=trust_code) if chain else None
    no_eager = None
    if bench or chain:
        from aotpipe.sources import check_source, rebuild_refusal

        source = art.manifest.model.source
        no_eager = rebuild_refusal(source, trust_code)
        if no_eager is None and isinstance(source, str):
            why = check_source(source)  # trusted, but it must import here too
            if why:
                no_eager = (f"the model's source does not import from {Path.cwd()}: {why} (run replay from the "
                            "folder the pipeline ran in, or put the module on PYTHONPATH)")
    ok = all(r.ok for r in results) and (chained is None or chained.status == "match")
    if as_json:
        out = {"artifact": art.name, "ok": ok, "graphs": [r.to_json() for r in results]}
        if chained is not None:
            out["chain"] = chained.to_json()
        if no_eager:
            out["no_eager_comparison"] = no_eager
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        width = max([10] + [len(r.kind) for r in results])
        for r in results:
            line = f"{r.kind:<{width}} {r.status:<9} ({r.inputs} inputs)"
            if r.max_abs_error is not None:
                line += f"  max abs error {r.max_abs_error:.3g}"
            line += f"  {r.seconds * 1e3:.2f} ms"
            if r.bench_seconds is not None:
                line += f"  median of {bench}: {r.bench_seconds * 1e3:.3f} ms"
                if r.eager_bench_seconds is not None:
                    line += f" (eager {'model' if r.kind.startswith('inference') else 'fwd+bwd'}: {r.eager_bench_seconds * 1e3:.3f} ms)"
            click.echo(line)
            for m in r.mismatches:
                click.echo(f"    {m}")
            if r.first_divergence:
                click.echo(f"    first diverging node: {r.first_divergence}")
            if r.error:
                click.echo(f"    error: {r.error}")
        if chained is not None:
            eager = ("" if chained.max_abs_error_vs_eager is None
                     else f", vs eager autograd max abs error {chained.max_abs_error_vs_eager:.3g}")
            click.echo(f"{'chain':<{width}} {chained.status:<9} forward -> backward, {chained.compared} gradients "
                       f"vs joint max abs error {chained.max_abs_error_vs_joint:.3g}{eager}")
            for m in chained.problems:
                click.echo(f"    {m}")
        if no_eager:
            click.echo(f"note: no eager comparison: {no_eager}", err=True)
    sys.exit(0 if ok else 1)


def _artefact_folder(p: Any) -> None:
    """Refuse, in one line, a folder that holds artefacts rather than being one (a pipeline's output)."""
    from aotpipe.artifact.verify import find_artifacts

    if not p.is_dir() or (p / "manifest.json").exists() or (p / "graph.json").exists():
        return
    models, _ = find_artifacts(p)
    if models:
        raise AotpipeError(f"{p} is not an artefact folder; pass a model folder such as {models[0]}")


@main.command(short_help="Check artefacts' files: hashes, format, loading.")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the problems as JSON.")
@click.option("--key", "key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Also check each artefact's signature (signature.json) with this key: an HMAC secret, "
                   "or an Ed25519 PEM public or private key.")
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

    from aotpipe.artifact.limits import Breach
    from aotpipe.artifact.verify import verify_tree

    from aotpipe.artifact.load import parse_trust

    parse_trust(trust_ops)  # a malformed --trust-ops is the user's error, once
    results = verify_tree(Path(directory), Path(key) if key else None, trust_ops=trust_ops)
    if not results:  # a mistyped path must not pass a CI step
        raise AotpipeError(f"{directory}: no artefacts found (looked for manifest.json in it and every folder below); "
                           "nothing was checked: pass a pipeline's output folder or a model folder")
    bad = {str(k): v for k, v in results.items() if v}
    if as_json:
        click.echo(json.dumps({"checked": len(results), "problems": bad}, indent=2, sort_keys=True))
    else:
        for folder, problems in results.items():
            if problems:
                click.echo(f"FAILED  {folder}")
                for p in problems:
                    click.echo(f"    {p}")
            else:
                failed = _failed_at_capture(folder)
                click.echo(f"ok      {folder}" + (f"  (files intact; the artefact itself FAILED when captured: "
                                                  f"{failed})" if failed else ""))
        click.echo(f"{len(results) - len(bad)}/{len(results)} artefacts ok (integrity: hashes, format, safe loading, "
                   "module.py; `aotpipe show` says how each checked when captured)")
    breaches = any(isinstance(p, Breach) for problems in results.values() for p in problems)
    sys.exit(2 if breaches else 1 if bad else 0)


def _failed_at_capture(folder: Any) -> str | None:
    """Why the run that wrote the artefact in `folder` failed it, or None (also when its
    manifest cannot be read: verify has said so)."""
    from pathlib import Path

    from aotpipe.artifact import records
    from aotpipe.results import why_failed

    try:
        _, manifest = records.read(records.Manifest, Path(folder) / records.MANIFEST)
    except (AotpipeError, OSError):
        return None
    return why_failed(manifest)


@main.command(short_help='Sign every artefact under a folder.')
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--key", "key", type=click.Path(exists=True, dir_okay=False), required=True,
              help="An Ed25519 PEM private key, or a file of at least 32 secret bytes for HMAC-SHA256.")
@_user_errors
def sign(directory: str, key: str) -> None:
    """Sign every artefact under DIRECTORY (signature.json beside each manifest.json).

    Each must verify first. Check with: aotpipe verify DIRECTORY --key KEY (the public key
    for Ed25519, the same secret for HMAC).

    \b
    Examples:
      aotpipe sign artifacts/quickstart --key signing.pem
    """
    from pathlib import Path

    from aotpipe.artifact.signing import load_key, sign_artifact
    from aotpipe.artifact.verify import find_artifacts
    from aotpipe.errors import LimitError

    k = load_key(key, for_signing=True)
    models, unfinished = find_artifacts(Path(directory))
    failed, breach = 0, False
    for m in models:
        try:
            sign_artifact(m, key)
            click.echo(f"signed  {m}  ({k.algorithm}, key id {k.key_id})")
        except AotpipeError as e:
            failed += 1
            breach = breach or isinstance(e, LimitError)
            click.echo(f"FAILED  {m}\n    {e}")
    for u in unfinished:
        failed += 1
        click.echo(f"FAILED  {u}\n    {u / 'manifest.json'}: missing (an incomplete artefact)")
    if not models and not unfinished:
        click.echo(f"no artefacts under {directory}", err=True)
    sys.exit(2 if breach else 1 if failed else 0)


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

    from aotpipe.inspect import list_artifacts

    rows = list_artifacts(Path(directory))
    if not rows:
        click.echo(f"no artefacts under {directory}")
        return
    width = max(len(r["path"]) for r in rows)
    for r in rows:
        click.echo(f"{r['path']:<{width}}  {r['status']:<10} {r['graphs']:<36} {r['size']}")
    refused = [r["error"] for r in rows if r.get("error")]
    for line in refused:
        click.echo(f"error: {line}", err=True)
    if refused:
        sys.exit(2)


@main.command(short_help="Describe one artefact's graphs.")
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--trust-ops", "trust_ops", multiple=True, metavar="NS[=MODULE]",
              help="Accept ops of this library namespace (as replay --trust-ops).")
@_user_errors
@_byte_limit
def show(artifact: str, trust_ops: tuple[str, ...]) -> None:
    """Print an artefact's graphs, node counts, op histogram, inputs and outputs.

    \b
    Examples:
      aotpipe show artifacts/quickstart/small_cnn
    """
    from pathlib import Path

    from aotpipe.inspect import describe

    click.echo(describe(Path(artifact), trust_ops=trust_ops))


if __name__ == "__main__":
    main()
