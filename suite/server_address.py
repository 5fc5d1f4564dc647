"""Where an arm's server listens: vLLM's own `vllm serve` flags ``--host`` and ``--port``, given in serve_args (the
matrix's, then the arm's) exactly as on a `vllm serve` command line, read into a `ServerAddress`.

They are read as :mod:`suite.served_model` reads the model flags (the same reader: ``--port 8000`` and
``--port=8000`` alike, the last copy wins). Left out, the suite's defaults hold: ``127.0.0.1`` (vLLM's own default
listens on every interface), and a free port the suite picks for each server (``--port 0`` says the same). The
suite passes the address to `vllm serve` itself, right after the model and its served name (the serve_args' copies
taken out, so the server sees one of each), and the clients call that address.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from suite.served_model import check_flag_values, flag_values, not_empty, without_flags

HOST = "--host"
PORT = "--port"
ADDRESS_FLAGS = (HOST, PORT)
DEFAULT_HOST = "127.0.0.1"
FREE_PORT = 0  # a free port the suite picks for each server
MAX_PORT = 65535


def parse_port(value: str) -> int:
    """A --port value as vLLM reads it (an int), from 0 (a free port) to 65535. Raises ValueError."""
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{PORT} {value!r}: not a port number (0 for a free one)") from None
    if not FREE_PORT <= port <= MAX_PORT:
        raise ValueError(f"{PORT} {value}: a port is 0 (a free one the suite picks) to {MAX_PORT}")
    return port


def check_address_flags(args: Sequence[str]) -> None:
    """Refuse an address vLLM would refuse or the suite cannot use: a flag without its value, an empty host, a
    port that is no port. The message starts with the flag."""
    check_flag_values(args, {HOST: not_empty(HOST), PORT: parse_port})


@dataclass(frozen=True)
class ServerAddress:
    """Where an arm's server listens and its clients call it: ``host``, and ``port`` (0: a free port the suite
    picks for each server). ``given`` names the flags the serve_args gave."""

    host: str = DEFAULT_HOST
    port: int = FREE_PORT
    given: frozenset[str] = field(default=frozenset())

    @classmethod
    def resolve(cls, serve_args: Sequence[str]) -> ServerAddress:
        """The address ``serve_args`` (the matrix's, then the arm's) give, or the defaults. Raises ValueError on a
        port that is no port."""
        host, port = flag_values(serve_args, HOST), flag_values(serve_args, PORT)
        given = frozenset(flag for flag, values in ((HOST, host), (PORT, port)) if values)
        return cls(host=host[0] if host else DEFAULT_HOST, port=parse_port(port[0]) if port else FREE_PORT,
                   given=given)

    @property
    def fixed(self) -> bool:
        """A port of the matrix's, not one picked for each server."""
        return self.port != FREE_PORT

    def server_args(self, port: int) -> list[str]:
        """The address the suite passes to `vllm serve`: the host and ``port`` (this one, or the one picked)."""
        return [HOST, self.host, PORT, str(port)]


def without_address(args: Sequence[str]) -> list[str]:
    """serve_args less their --host and --port (the suite passes the address itself, once)."""
    return without_flags(args, ADDRESS_FLAGS)
