"""Project exceptions. The CLIs turn these into one clean line and exit 1."""


class PalError(Exception):
    """An error in the user's input (a file, a param, an option), not a bug."""


class ParamsError(PalError, ValueError):
    """A params file, section or key is missing, misspelt or has a bad value."""


class ShardError(PalError, ValueError):
    """A feature shard is missing, truncated, or breaks the format contract."""
