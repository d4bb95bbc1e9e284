"""The `platform` command: parse arguments, call the Python API, render. No logic lives here.

Exit codes: 0 every trial ran ok; 1 the sweep ran but some trials failed; 2 bad input (one message,
no traceback; --debug shows it); 130 interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from amdahl.errors import UserError

EXIT_TRIALS_FAILED = 1


class _Group(click.Group):
    """Turns UserError into one message and exit 2, unless --debug asks for the traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            if ctx.params.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks for input errors.")
def main(debug: bool) -> None:
    """amdahl: sweep PyTorch training configurations on Ray and explain the speedup."""


@main.command()
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a sweep-file field, e.g. --set train.steps=20 (repeatable).",
)
@click.option("--address", default=None, help="Ray cluster address (default: start local Ray).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(spec_path: str, overrides: tuple[str, ...], address: str | None, as_json: bool) -> None:
    """Show the trials, their resources, and every trial that will not run (with the reason)."""
    import json

    from amdahl.run import make_plan, plan_summary, ray_nodes
    from amdahl.spec import load_spec

    spec = load_spec(spec_path, overrides)
    nodes = None
    if address:
        import ray

        ray.init(address=address, log_to_driver=False)
        nodes = ray_nodes()
    sweep_plan = make_plan(spec, nodes)
    if as_json:
        click.echo(json.dumps(plan_summary(sweep_plan), indent=1, default=str))
    else:
        from amdahl.render import print_plan

        print_plan(sweep_plan)
    if not sweep_plan.runnable:
        click.echo("error: no trial of this sweep can run on this cluster", err=True)
        sys.exit(2)


@main.command()
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a sweep-file field (repeatable).",
)
@click.option("--address", default=None, help="Ray cluster address, e.g. auto (default: local).")
@click.option(
    "--runs-dir",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where sweep directories are created.",
)
@click.option("--no-tracking", is_flag=True, help="Do not mirror results to MLflow.")
@click.option("-v", "--verbose", is_flag=True, help="Stream Ray's logs to the terminal.")
def sweep(
    spec_path: str,
    overrides: tuple[str, ...],
    address: str | None,
    runs_dir: str,
    no_tracking: bool,
    verbose: bool,
) -> None:
    """Run every trial of a sweep file and write runs/<name>-<time>/."""
    from amdahl.render import LiveProgress
    from amdahl.run import run_sweep
    from amdahl.spec import load_spec

    spec = load_spec(spec_path, overrides)
    with LiveProgress() as progress:
        outcome = run_sweep(
            spec,
            address=address,
            runs_dir=runs_dir,
            on_event=progress.event,
            verbose=verbose,
            tracking=False if no_tracking else None,
        )
    from amdahl.render import print_outcome

    print_outcome(outcome)
    if outcome.failed:
        sys.exit(EXIT_TRIALS_FAILED)


@main.command()
@click.argument("sweep_dirs", nargs=-1, required=True, type=click.Path())
def report(sweep_dirs: tuple[str, ...]) -> None:
    """Speedup-vs-ideal tables from results.parquet (no Ray needed)."""
    from amdahl.report import render_terminal

    for d in sweep_dirs:
        click.echo(render_terminal(Path(d)))


if __name__ == "__main__":
    main()
