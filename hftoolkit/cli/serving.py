"""`serve`: trained runs behind an OpenAI-compatible HTTP endpoint (hftoolkit/serving)."""

from __future__ import annotations

import ipaddress
import os
from typing import Annotated

import typer

from hftoolkit.base import extras
from hftoolkit.base.errors import UserError
from hftoolkit.cli.options import QuietOption, VerboseOption, tcp_port
from hftoolkit.serving.limits import Limits

API_KEY_VARIABLE = "HFTOOLKIT_API_KEY"


def serve(
    runs: Annotated[list[str], typer.Argument(metavar="RUN_DIR", help=(
        "Run directories written by train (or folders written by merge), each served as a model named by its "
        "folder, or NAME=RUN_DIR. Adapter runs on one base share one copy of it."))],
    host: Annotated[str, typer.Option(metavar="ADDRESS", help=(
        f"Address to listen on. Any but loopback needs an API key in {API_KEY_VARIABLE}."))] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, metavar="N", callback=tcp_port,
                                          help="Port, up to 65535 (0: any free one).")] = 8000,
    max_batch: Annotated[int, typer.Option(min=1, metavar="N", help=(
        "The most inputs answered in one forward pass."))] = 8,
    max_wait_ms: Annotated[float, typer.Option(min=0, metavar="MS", help=(
        "How long a batch waits for more requests while the server answers concurrent clients (a lone request, "
        "and greedy decoder generation, which is batched continuously, never wait)."))] = 10.0,
    max_tokens: Annotated[int, typer.Option(min=1, metavar="N", help=(
        "The most new tokens a request may ask for (continuous batching keeps room for --max-batch requests of "
        "that many)."))] = Limits.max_tokens,
    max_input_tokens: Annotated[int, typer.Option(min=1, metavar="N", help=(
        "The longest input a request may send, in tokens."))] = Limits.max_input_tokens,
    max_body_bytes: Annotated[int, typer.Option(min=1, metavar="N", help="The largest request body.")
                              ] = Limits.max_body_bytes,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Serve trained runs over HTTP with the OpenAI API: /v1/models, /v1/chat/completions, /v1/completions (also
    streamed), /v1/classifications, /health."""
    from hftoolkit.base import console
    from hftoolkit.base.lifecycle import Stopped

    api_key = os.environ.get(API_KEY_VARIABLE) or None
    if not _loopback(host) and api_key is None:
        raise UserError(f"--host {host}: a server reachable from other machines needs an API key: set "
                        f"{API_KEY_VARIABLE}, or listen on 127.0.0.1")
    extras.requires("serve", "serve")
    from hftoolkit.runs.rundir import run_folder_problem
    from hftoolkit.serving.registry import load_runs, run_names

    pairs = run_names(runs)
    for _, path in pairs:  # (every folder checked before the first model loads)
        if problem := run_folder_problem(path, merged=True):
            raise UserError(problem)
    import uvicorn

    sock = listening(host, port)  # (before the models load: a port in use is said at once)
    from hftoolkit.serving.api import build_app
    from hftoolkit.serving.batcher import Batcher

    with console.capture(verbosity=console.verbosity_from_flags(verbose, quiet), explain_loading=False):
        served = load_runs(pairs, max_batch, progress=console.phase)
    batcher = Batcher(max_batch, max_wait_ms / 1000, max_tokens)
    app = build_app(served, batcher, Limits(max_body_bytes, max_input_tokens, max_tokens), api_key)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=300))
    announce(server, len(served))
    try:
        server.run(sockets=[sock])
    except Stopped as stop:  # (uvicorn drained the requests in flight, then passed the signal on)
        typer.echo(f"stopped by {stop.name}: {batcher.answered} requests answered", err=True)
        stop.said = True
        raise
    finally:
        batcher.close()


def announce(server, models: int) -> None:
    """Print where the server listens once it does (the port, when 0 asked for any)."""
    started = server.startup

    async def startup(sockets=None):
        await started(sockets=sockets)
        for listening in server.servers:
            for sock in listening.sockets:
                host, port = sock.getsockname()[:2]
                typer.echo(f"serving {models} model{'s' * (models != 1)} on http://{host}:{port}", err=True)

    server.startup = startup


def listening(host: str, port: int):
    """A socket bound to host:port and listening; a port in use or an address this machine lacks, in one line."""
    import socket

    sock = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        # (proto TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and without it every response
        # waits out the client's delayed ACK)
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()
        return sock
    except (OSError, OverflowError) as err:  # (OverflowError: a port past 65535)
        if sock is not None:
            sock.close()
        reason = os.strerror(err.errno) if getattr(err, "errno", None) else str(err)
        raise UserError(f"--host {host} --port {port}: can't listen there ({reason}): choose another port, or "
                        "--port 0 for any free one") from None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
