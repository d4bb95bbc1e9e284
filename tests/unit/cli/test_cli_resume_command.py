"""The resume command a stopped sweep prints is shell-quoted: pasted into a shell, it runs the
same sweep file with the same overrides, whatever spaces, quotes or $ they hold."""

import shlex
import signal

from click.testing import CliRunner

from amdahl.cli.commands import main
from amdahl.driver import sweep as run
from amdahl.driver.signals import SweepInterrupted


def test_the_printed_resume_command_survives_a_shell(tmp_path, monkeypatch):
    folder = tmp_path / "my sweeps $HOME"
    folder.mkdir()
    spec = folder / "it's.yaml"
    spec.write_text("name: q\nworkload: mlp\n")
    stopped = folder / "runs" / "q 1"
    overrides = ["params.hidden=[64, 32]", "tracking.experiment=a b;rm -rf x", "train.steps=5"]

    def stop(*args, **kwargs):
        raise SweepInterrupted(stopped, signal.SIGINT)

    monkeypatch.setattr(run, "run_sweep", stop)
    argv = ["sweep", str(spec)] + [part for o in overrides for part in ("--set", o)]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 130, result.output
    line = result.output.split("resume with: ", 1)[1].splitlines()[0]
    assert shlex.split(line) == ["platform", *argv, "--resume", str(stopped)]
