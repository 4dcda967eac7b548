"""The one exception type for bad user input: the CLI prints its message on one line and exits 2."""


class PodsError(Exception):
    """A configuration, data, model or reward problem the user can fix."""
