"""The one exception type for bad user input: the CLI prints its message on one line and exits 2."""


class PodsError(Exception):
    """A configuration, data, model or reward problem the user can fix."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (the CLI raises it in the main thread)."""


def first_line(e: BaseException) -> str:
    """An exception's message on one line (its type's name where it has none)."""
    return (str(e).strip() or type(e).__name__).splitlines()[0]
