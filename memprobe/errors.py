"""memprobe's errors, and the reading of the TOML files users write. Library code raises these;
only the CLI turns them into exit codes."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Iterable


class MemprobeError(Exception):
    """An error the user can act on, shown as one line; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class BadInput(MemprobeError):
    """The command line, a strategy file or a baseline is wrong: exit code 2."""

    exit_code = 2


def unknown(what: str, name: object, known: Iterable[str], where: str = "") -> BadInput:
    """The one-line refusal of a name memprobe does not know, with the nearest known one
    where a typo is likely ("did you mean 'scan-checkpoint'?") and then every known one."""
    known = list(known)
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return BadInput(f"{where}unknown {what} {name!r} ({hint}known: {', '.join(known)})")


def read_toml(path: Path, kind: str) -> dict[str, Any]:
    """A TOML file the user named (``kind``: "strategy file", "model file"); a missing,
    unreadable or malformed one is refused in one line naming it."""
    try:
        with Path(path).open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise BadInput(f"{path}: {kind} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{path}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:  # tomllib reads UTF-8 only
        raise BadInput(f"{path}: not valid TOML (not UTF-8 text: byte {e.object[e.start]:#04x} at offset "
                       f"{e.start})") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot read ({e.strerror})") from None
