"""User-facing errors: printed as one clear message by the CLI, never as a traceback."""


class SuiteError(Exception):
    """An error the user can act on (bad input, failed server, patch conflict...)."""


class MatrixError(SuiteError):
    """A matrix file is malformed or invalid; the message names file:line and field."""


class ServerError(SuiteError):
    """A vLLM server failed to start or died; the message carries the command and log tail."""


class PatchError(SuiteError):
    """A patch set is unknown, malformed, does not fit the vLLM version, or a hunk does not apply."""
