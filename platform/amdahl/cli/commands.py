"""The `platform` command: parse arguments, call the Python API, render. No logic lives here.

Exit codes: 0 every trial ran ok; 1 the sweep ran but some trials failed, or `mlflow-push` could
not push every row (an error that is not an outage); 2 bad input (one message, no traceback;
--debug shows it); 130 interrupted (Ctrl-C); 141 the reader of the output stopped reading
(`platform report DIR | head`); 143 stopped by SIGTERM (`ray job stop`).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from amdahl.cli.terminal import Terminal
from amdahl.errors import UserError

EXIT_TRIALS_FAILED = 1
EXIT_PUSH_FAILED = 1


class _Group(click.Group):
    """Turns UserError into one message and exit 2, unless --debug asks for the traceback;
    runs a command's old name (ALIASES) as the command, without listing it in --help."""

    #: Old command name -> the command it became.
    ALIASES = {"sync": "mlflow-push"}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.ALIASES.get(cmd_name, cmd_name))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
            return result
        except UserError as e:
            if ctx.params.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except BrokenPipeError:
            if ctx.params.get("debug") or not _stdout_closed():
                raise  # a socket's or a subprocess's pipe: a fault, not a reader that left
            Terminal().on_broken_pipe()  # click.echo's output into a closed pipe


def _stdout_closed() -> bool:
    """Whether standard output's reader is gone (a pipe whose read end closed)."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


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
@click.option(
    "--address",
    default=None,
    help="Ray cluster address, joined to plan for its nodes [default: as `platform sweep`: the "
    "Ray cluster running here (after `ray up` and `ray attach`, or `ray start`), else this "
    "machine, with no Ray started].",
)
@click.option(
    "--local", is_flag=True, help="Plan for this machine even where a cluster is running."
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(
    spec_path: str, overrides: tuple[str, ...], address: str | None, local: bool, as_json: bool
) -> None:
    """Show the trials, their resources, and every trial that will not run (with the reason),
    on the machines `platform sweep` would run them on."""
    import json

    from amdahl import load_spec, plan_for, plan_summary

    spec = load_spec(spec_path, overrides)
    if local and address:
        raise UserError("--local plans for this machine; it cannot be combined with --address")
    sweep_plan = plan_for(spec, "local" if local else address)
    if as_json:
        click.echo(json.dumps(plan_summary(sweep_plan), indent=1, default=str))
    else:
        from amdahl.cli.progress import print_plan

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
@click.option(
    "--address",
    default=None,
    help="Ray cluster address [default: the Ray cluster running here (after `ray up` and "
    "`ray attach`, or `ray start`), else a new local Ray].",
)
@click.option(
    "--local", is_flag=True, help="Start a private local Ray even where a cluster is running."
)
@click.option(
    "--runs-dir",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where sweep directories are created.",
)
@click.option(
    "--resume",
    "resume",
    is_flag=False,
    flag_value="latest",
    default=None,
    metavar="[DIR]",
    help="Run only what is missing in DIR (default: the newest runs/<name>-<UTC time>).",
)
@click.option("--retry-failed", is_flag=True, help="With --resume, run failed trials again.")
@click.option(
    "--new-if-changed",
    is_flag=True,
    help="With --resume, start a new sweep directory when the settings differ from DIR's "
    "(instead of refusing).",
)
@click.option("--no-tracking", is_flag=True, help="Do not mirror results to MLflow.")
@click.option(
    "--recalibrate",
    is_flag=True,
    help="Measure the all-reduce calibration even where an earlier sweep in --runs-dir "
    "measured it on the same cluster shape within a day (reused by default).",
)
@click.option("-v", "--verbose", is_flag=True, help="Stream Ray's logs to the terminal.")
def sweep(  # noqa: PLR0913 - click passes one argument per option
    spec_path: str,
    overrides: tuple[str, ...],
    address: str | None,
    local: bool,
    runs_dir: str,
    resume: str | None,
    retry_failed: bool,
    new_if_changed: bool,
    no_tracking: bool,
    recalibrate: bool,
    verbose: bool,
) -> None:
    """Run every trial of a sweep file and write runs/<name>-<time>/."""
    from amdahl import SweepInterrupted, latest_sweep_dir, load_spec, run_sweep
    from amdahl.cli.progress import LiveProgress, print_outcome

    spec = load_spec(spec_path, overrides)
    if local and address:
        raise UserError("--local starts a private Ray; it cannot be combined with --address")
    if retry_failed and resume is None:
        raise UserError("--retry-failed only makes sense with --resume")
    if new_if_changed and resume is None:
        raise UserError("--new-if-changed only makes sense with --resume")
    if resume == "latest":
        resume = str(latest_sweep_dir(runs_dir, spec.name))
    try:
        with LiveProgress() as progress:
            outcome = run_sweep(
                spec,
                address="local" if local else address,
                runs_dir=runs_dir,
                resume=resume,
                retry_failed=retry_failed,
                new_if_changed=new_if_changed,
                on_event=progress.event,
                verbose=verbose,
                tracking=False if no_tracking else None,
                recalibrate=recalibrate,
            )
    except SweepInterrupted as e:
        sets = [part for o in overrides for part in ("--set", o)]  # quoted: copy-paste safe
        ray_choice = ["--local"] if local else ["--address", address] if address else []
        again = ["platform", "sweep", spec_path, *sets, "--resume", str(e.sweep_dir), *ray_choice]
        click.echo(
            f"\n{e.reason}: finished trials are saved in {e.sweep_dir}\n"
            f"resume with: {shlex.join(again)}",
            err=True,
        )
        sys.exit(e.exit_code)
    print_outcome(outcome)
    if outcome.failed:
        sys.exit(EXIT_TRIALS_FAILED)


@main.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False))
def init(directory: str) -> None:
    """Write a commented workload (myworkload.py) and a sweep file (sweep.yaml) that runs as
    written, into DIRECTORY (default: here); existing files are never overwritten."""
    from amdahl.cli.scaffold import next_steps, write_scaffold

    written = write_scaffold(directory)
    click.echo(f"written: {', '.join(str(p) for p in written)}")
    click.echo(f"next:    {next_steps(directory)}")


@main.command("mlflow-push")
@click.argument("sweep_dir", type=click.Path())
def mlflow_push(sweep_dir: str) -> None:
    """Push to MLflow every result of SWEEP_DIR that MLflow does not have yet (rows it has are
    found by their tags, not duplicated). Refused while a sweep driver writes SWEEP_DIR."""
    from amdahl import push_results

    with _quiet("amdahl.track.tracker"):
        outcome = push_results(sweep_dir)
    again = f"`platform mlflow-push {shlex.quote(sweep_dir)}`"
    if outcome.offline_reason:
        raise UserError(
            f"MLflow unreachable: {outcome.offline_reason}; nothing lost, run {again} again "
            "when it is back"
        )
    if outcome.error:
        click.echo(
            f"error: pushing to MLflow failed ({outcome.error}); {outcome.pushed} rows pushed. "
            f"Every row is in {outcome.results}: once the cause is fixed, {again} pushes what "
            "MLflow lacks",
            err=True,
        )
        sys.exit(EXIT_PUSH_FAILED)
    click.echo(
        f"{outcome.pushed} rows pushed to MLflow, {outcome.already_there} were already there"
    )
    for line in outcome.link.lines() if outcome.link else ():
        click.echo(line)


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Hold back a logger's messages (the tracker logs an outage or a failure, as a running
    sweep needs): the command says what happened itself, as one message."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@main.command()
@click.argument("sweep_dirs", nargs=-1, required=True, type=click.Path())
@click.option(
    "--all",
    "print_all",
    is_flag=True,
    help="Print every section here (default: the recommendation, the top configurations and "
    "the best one's scaling, naming what is left out; report.md/html always hold it all).",
)
def report(sweep_dirs: tuple[str, ...], print_all: bool) -> None:
    """Speedup-vs-ideal report from results.parquet (no Ray needed).

    Prints its short view (or every section with --all), and writes report.md and report.html
    into each sweep directory; with several directories, also compares them side by side.
    """
    from amdahl import build_report, comparison, write_reports
    from amdahl.report.render_text import print_report, print_sections

    console = Terminal()
    reports = []
    for d in sweep_dirs:
        built = build_report(Path(d))
        paths = write_reports(Path(d), built)
        print_report(built, console, full=print_all)
        console.print(f"written: {paths['markdown']} and {paths['html']}", markup=False)
        console.print(_best_line(paths.get("best"), built) + "\n", markup=False, soft_wrap=True)
        reports.append(built)
    if len(reports) > 1:
        print_sections([comparison(reports)], console)


def _best_line(best: Path | None, built: Any) -> str:
    """The command that runs best.yaml, or why the report wrote none (report/best.py)."""
    from amdahl.report.best import best_config, sweep_command

    if best is not None:
        return f"best:    {sweep_command(best)}  (runs the recommended configuration again)"
    return f"best:    no best.yaml: {best_config(built)}"


def _counts(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """`16,32,64` -> [16, 32, 64]; anything else is a usage error (exit 2)."""
    if value is None:
        return None
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{value!r}: give positive whole numbers separated by commas")
    return counts


@main.command()
@click.argument("sweep_dir", type=click.Path())
@click.option(
    "--devices",
    required=True,
    callback=_counts,
    metavar="N,N,...",
    help="Device counts to predict, e.g. 16,32,64.",
)
@click.option(
    "--batch-size",
    "batch_sizes",
    default=None,
    callback=_counts,
    metavar="B,B,...",
    help="Batch sizes as the grid means them (per device; global under strong scaling) "
    "[default: each family's measured ones].",
)
@click.option(
    "--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes spanned."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print every prediction, its 80% interval (throughput_low/_high, step_s_low/_high), "
    "terms and caveats as JSON.",
)
def predict(
    sweep_dir: str, devices: list[int], batch_sizes: list[int] | None, nodes: int, as_json: bool
) -> None:
    """Predict throughput (with an 80% interval), speedup, efficiency and cost at device counts,
    batch sizes and node counts SWEEP_DIR did not measure, from its results.parquet and
    calibration.json (no Ray)."""
    from amdahl import predict_sweep

    result = predict_sweep(Path(sweep_dir), devices, batch_sizes, nodes)
    if as_json:
        import json

        click.echo(json.dumps(result.as_dict(), indent=1, default=str))
        return
    from amdahl.report.prediction_document import prediction_sections
    from amdahl.report.render_text import print_sections

    print_sections(prediction_sections(result), Terminal())


@main.command()
@click.argument("sweep_dir", type=click.Path(file_okay=False))
@click.option("--devices", default=2, show_default=True, help="Workers taking part (>= 2).")
@click.option(
    "--cpus-per-worker", default=0.5, show_default=True, help="Ray CPUs per calibration worker."
)
@click.option("--gpu", "use_gpu", is_flag=True, help="One GPU per worker (NCCL).")
@click.option(
    "--max-bytes",
    type=click.IntRange(min=16),
    default=None,
    help="Largest all-reduce message in bytes [default: 536870912 (512 MiB) with --gpu, "
    "16777216 (16 MiB) on CPU].",
)
@click.option("--address", default=None, help="Ray cluster address (default: start local Ray).")
def calibrate(
    sweep_dir: str,
    devices: int,
    cpus_per_worker: float,
    use_gpu: bool,
    max_bytes: int | None,
    address: str | None,
) -> None:
    """Measure all-reduce latency/bandwidth and peak FLOP/s into SWEEP_DIR/calibration.json."""
    from amdahl import run_calibration
    from amdahl.driver.calibrate import summary
    from amdahl.sweepdir.layout import SweepDir

    result = run_calibration(
        devices,
        Path(sweep_dir),
        resources_per_worker={"CPU": cpus_per_worker},
        use_gpu=use_gpu,
        max_bytes=max_bytes,
        address=address,
    )
    click.echo(summary(result))
    click.echo(f"written: {SweepDir(sweep_dir).calibration}; `platform report` now uses it")


@main.group()
def data() -> None:
    """The data cache (generated rows), and public data sets converted to the parquet layout
    `params.data` reads."""


@data.command("list")
def data_list() -> None:
    """The generated copies in the data cache: workload, split, data parameters, size."""
    from amdahl.data.storage import DEFAULT_CACHE, cached_datasets

    copies = cached_datasets()
    click.echo(f"data cache: {DEFAULT_CACHE} (AMDAHL_DATA_DIR moves it)")
    for c in copies:
        made = c.made
        what = f"{made.get('name', '?')} {made.get('split', '?')} {made.get('data_key', '')}"
        click.echo(f"  {c.path.name}  {c.bytes / 2**20:,.1f} MiB  {what}")
    if not copies:
        click.echo("  (no generated rows)")


@data.command("clear")
@click.option("--workload", "name", default=None, help="Only this workload's copies (its name).")
def data_clear(name: str | None) -> None:
    """Remove generated copies from the data cache; the next sweep generates them again."""
    from amdahl.data.storage import clear_datasets

    removed = clear_datasets(name=name)
    click.echo(f"removed {len(removed)} generated cop{'y' if len(removed) == 1 else 'ies'}")


@data.command("fashion-mnist")
@click.option(
    "--from",
    "src",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory holding Fashion-MNIST's four IDX files (train-images-idx3-ubyte.gz, ...).",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False),
    help="Where to write train/ and val/ parquet (default: the amdahl data cache).",
)
def fashion_mnist(src: str, out: str | None) -> None:
    """Fashion-MNIST (D2L's multi-GPU data set) from its IDX files to parquet."""
    from amdahl import convert_fashion_mnist
    from amdahl.data.storage import DEFAULT_CACHE

    written = convert_fashion_mnist(src, out or DEFAULT_CACHE / "fashion-mnist")
    click.echo(f"written: {written}/train and {written}/val")
    click.echo(f"use it with:  params: {{data: {written}}}  (workload: resnet)")


if __name__ == "__main__":
    main()
