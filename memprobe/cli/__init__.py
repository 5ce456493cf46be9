"""The memprobe command line: one file per command, one error boundary (``main``)."""

from __future__ import annotations

import typer
from typer.exceptions import Abort, Exit, TyperException

from memprobe.cli import check, compare, explain, fit, report, strategies, targets
from memprobe.cli._output import messages
from memprobe.errors import MemprobeError

app = typer.Typer(
    name="memprobe",
    help="Will this training step fit in accelerator memory, and which remat strategy gets it "
    "there cheapest? Compiles Gemma 4 small train steps ahead of time (deviceless for TPU) "
    "and reads the compiler's own memory figures.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("compare")(compare.compare)
app.command("report")(report.report)
app.command("baseline")(compare.baseline)
app.command("fit")(fit.fit)
app.command("check")(check.check)
app.command("explain")(explain.explain)
app.command("strategies")(strategies.list_strategies)
app.command("targets")(targets.list_targets)

err = messages()


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; every error the user can act on ends as one line on stderr."""
    try:
        result = app(args=argv, standalone_mode=False, prog_name="memprobe")
        return result if isinstance(result, int) else 0
    except MemprobeError as e:
        err.print(f"memprobe: error: {e}", markup=False)
        return e.exit_code
    except Exit as e:
        return e.exit_code
    except TyperException as e:  # usage errors: unknown option, a value of the wrong type
        err.print(f"memprobe: error: {e.format_message()}", markup=False)
        return e.exit_code
    except (Abort, KeyboardInterrupt):
        err.print("memprobe: interrupted", markup=False)
        return 130

