"""memprobe's errors. Library code raises these; only the CLI turns them into exit codes."""


class MemprobeError(Exception):
    """An error the user can act on, shown as one line; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class BadInput(MemprobeError):
    """The command line, a strategy file or a baseline is wrong: exit code 2."""

    exit_code = 2
