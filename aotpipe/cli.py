"""The `aotpipe` command: parse arguments, call the library, print. Nothing else."""

from __future__ import annotations

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="aotpipe")
def main(verbose: bool) -> None:
    """aotpipe: capture, save and check ahead-of-time FX graphs of PyTorch models."""


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(file_okay=False), help="Output folder (overrides the YAML's output).")
@click.option("--only", multiple=True, metavar="NAME", help="Run only this model (repeatable).")
@click.option("--executor", type=click.Choice(["local"]), default=None, help="Where models run (local: in-process).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Parallel workers (local runs one at a time).")
@click.option("--force", is_flag=True, help="Redo models even if their artefacts exist.")
@click.option("--json", "as_json", is_flag=True, help="Print run.json to stdout instead of a summary.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@_user_errors
def run(pipeline: str, output: str | None, only: tuple[str, ...], executor: str | None, workers: int | None,
        force: bool, as_json: bool, no_progress: bool) -> None:
    """Capture every model of PIPELINE into graph artefacts."""
    from aotpipe.config import load_pipeline
    from aotpipe.report import RUN_JSON, REPORT_MD
    from aotpipe.runner import run_pipeline

    p = load_pipeline(pipeline)
    result = run_pipeline(p, output=output, only=only, progress=not no_progress and not as_json)
    if as_json:
        click.echo((result.output / RUN_JSON).read_text())
    else:
        for m in result.models:
            if m.status == "ok":
                kinds = ", ".join(f"{g.kind}({g.nodes})" for g in m.graphs)
                click.echo(f"ok      {m.name:<24} {m.capture_seconds:6.2f}s  {kinds}")
            else:
                click.echo(f"FAILED  {m.name:<24} {m.stage}: {m.error}")
        n_ok = sum(m.status == "ok" for m in result.models)
        click.echo(f"{n_ok}/{len(result.models)} models ok in {result.seconds:.1f}s -> {result.output}/ "
                   f"(see {REPORT_MD})")
    sys.exit(0 if result.ok else 1)


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False))
@_user_errors
def validate(pipeline: str) -> None:
    """Check PIPELINE without tracing anything: print ok, or every error."""
    from aotpipe.config import load_pipeline

    p = load_pipeline(pipeline)
    click.echo(f"ok: {pipeline}: pipeline {p.name!r}, {len(p.models)} model(s)")


@main.command()
def schema() -> None:
    """Print the JSON Schema of the pipeline YAML."""
    from aotpipe.config import json_schema

    click.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
