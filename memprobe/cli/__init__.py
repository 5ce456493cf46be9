"""The memprobe command line: one file per command, one error boundary (``main``)."""

from __future__ import annotations

import inspect
import signal
import threading
from typing import Annotated, get_args

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.exceptions import Abort, Exit, TyperException

from memprobe.cli import check, compare, explain, fit, models, report, strategies, targets
from memprobe.cli._output import messages
from memprobe.errors import MemprobeError


def _help(fn) -> str:
    """A command's docstring as help: paragraphs kept, the source's line breaks inside one
    dropped. Typer's rich help keeps them, so `--help` and the command list broke lines
    mid-sentence wherever the docstring wrapped at 100 columns."""
    paragraphs = inspect.cleandoc(fn.__doc__ or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


class _PlainTypes:
    """Typer's help gives every parameter a type column in Python's words, flags too:
    `--no-cache <bool>` and `--help <bool>` read as if they took a value, and `report`'s
    RESULT read `<list[Path]>`. A flag's column is left empty (it takes no value) and a
    repeated argument reads `<path>...`; every other option keeps its type or metavar."""

    def format_help(self, ctx, formatter) -> None:
        for param in self.get_params(ctx):
            if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
                param.metavar = ""
            elif isinstance(param, TyperArgument) and param.type_descriptor.is_list:
                item = get_args(param.type_descriptor.annotation)[0].__name__.lower()
                param.display_type_rich = lambda ctx, item=item: f"<{item}>..."
        super().format_help(ctx, formatter)


class _Command(_PlainTypes, TyperCommand):
    pass


class _Group(_PlainTypes, TyperGroup):
    pass


app = typer.Typer(
    name="memprobe",
    help="Will this training step fit in accelerator memory, and which remat strategy gets it "
    "there cheapest? Compiles Gemma 4 small train steps ahead of time (deviceless for TPU "
    "and NVIDIA GPUs) and reads the compiler's own memory figures.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if not value:
        return
    from memprobe.compile import GPU_PACKAGES, package_versions

    compilers = ("jax", "jaxlib", "libtpu", *GPU_PACKAGES, "flax", "optax")
    found = package_versions(("memprobe", *compilers))
    print(f"memprobe {found.get('memprobe', 'unknown')}")
    for pkg in compilers:
        note = {"libtpu": "TPU targets", GPU_PACKAGES[0]: "GPU targets: the gpu extra"}.get(pkg)
        print(f"  {pkg} {found.get(pkg, 'not installed')}" + (f" ({note})" if note and pkg not in found else ""))
    raise Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the versions of memprobe and of the compilers it uses, then exit.")] = False) -> None:
    pass


for _name, _fn in [("compare", compare.compare), ("report", report.report), ("baseline", compare.baseline),
                   ("fit", fit.fit), ("check", check.check), ("explain", explain.explain),
                   ("strategies", strategies.list_strategies), ("targets", targets.list_targets),
                   ("models", models.list_models)]:
    app.command(_name, help=_help(_fn), cls=_Command)(_fn)

err = messages()


_signalled: list[int] = []


def _on_signal(signum: int, frame) -> None:
    _signalled.append(signum)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; every error the user can act on ends as one line on stderr.

    SIGTERM (``timeout``, ``kill``, a cancelled CI job) ends it as Ctrl-C does: with one
    line, exit code 128 + the signal, and the compiles it started killed, not left running.
    A reader that closes the pipe early (``memprobe targets | head -1``) ends it quietly with
    141, what a shell reports for a command the closed pipe stopped: not 1, which says that a
    strategy failed or a check did not pass.
    """
    previous = _catch_signals()
    _signalled.clear()
    try:
        result = app(args=argv, standalone_mode=False, prog_name="memprobe")
        if _signalled:  # typer turned the interrupt into a plain exit code
            return _interrupted()
        return result if isinstance(result, int) else 0
    except MemprobeError as e:
        err.print(f"memprobe: error: {e}", markup=False)
        return e.exit_code
    except Exit as e:
        return e.exit_code
    except TyperException as e:  # usage errors: unknown option, a value of the wrong type
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `memprobe`: the help, printed, is the answer
            return 0
        err.print(f"memprobe: error: {_usage_message(e)}", markup=False)
        return e.exit_code
    except (Abort, KeyboardInterrupt):
        return _interrupted()
    except SystemExit as e:
        # typer and rich both answer a write to a closed pipe with exit(1), raised while they
        # handle the BrokenPipeError, having first made later writes go nowhere
        if isinstance(e.__context__, BrokenPipeError):
            return 128 + signal.SIGPIPE
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_NOT_A = {"int_parsing": "an integer", "int_from_float": "a whole number", "float_parsing": "a number",
          "bool_parsing": "true or false"}


def _usage_message(e: TyperException) -> str:
    """Typer's message, in a user's words: typer checks values with pydantic, whose text
    ("Input should be a valid integer, unable to parse string as an integer") neither names
    the value given nor reads as one line of a CLI; an enum option's carries "Value error, "."""
    message = e.format_message().replace("Value error, ", "")
    errors = getattr(e.__cause__, "errors", None)
    try:
        first = errors()[0] if callable(errors) else {}
    except Exception:  # not pydantic's, or not as expected: its words as they are
        return message
    kind, value, said = _NOT_A.get(first.get("type")), first.get("input"), first.get("msg", "")
    if kind and isinstance(value, str) and said and said in message:
        several = " (one value here)" if "," in value else ""  # explain --seq 512,1024: no sweep
        return message.replace(said, f"{value!r} is not {kind}{several}")
    return message


def _catch_signals() -> dict[int, object]:
    """SIGINT and SIGTERM raise KeyboardInterrupt, noting which came; one ignored (SIGINT
    in a shell's background job) stays ignored. Returns the handlers to put back."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if handler in (signal.SIG_DFL, signal.default_int_handler):
            previous[sig] = signal.signal(sig, _on_signal)
    return previous


def _interrupted() -> int:
    sig = _signalled[-1] if _signalled else signal.SIGINT
    err.print("memprobe: terminated" if sig == signal.SIGTERM else "memprobe: interrupted", markup=False)
    return 128 + sig
