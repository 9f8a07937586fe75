"""`attnserve serve`: settings from flags and ATTNSERVE_*, export on first start, uvicorn."""
from __future__ import annotations

import logging
import socket
import sys

from pydantic import ValidationError

log = logging.getLogger("attnserve")

# Settings whose values never appear in an error message.
_SECRET_SETTINGS = {"api_key"}


def settings_errors(exc: ValidationError) -> str:
    """One line per invalid setting: its name, what is wrong, and the value given unless it is
    secret (pydantic's own text shows every input, the API key too)."""
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        line = f"  {name}: {error['msg']}"
        if error["loc"] and error["loc"][0] not in _SECRET_SETTINGS:
            line += f" (got {error['input']!r})"
        lines.append(line)
    return "\n".join(lines)


def _settings(args, command: str):
    """The Settings of flags and ATTNSERVE_*, or the exit status 2 after saying what is invalid."""
    from attnserve.service.settings import settings_from_args

    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        print(f"attnserve {command}: invalid settings:\n" + settings_errors(exc), file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"attnserve {command}: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return settings


def prepare_command(args) -> int:
    """`attnserve prepare`: make (or check) the export that `attnserve serve` with the same
    flags and ATTNSERVE_* would serve, print its folder and exit; a Kubernetes init container's
    step (deploy/kubernetes/components/model), or a first start's export done ahead of time.
    Run again, it exports nothing: it checks that the export there is still of the model."""
    from attnserve.contract.export_format import ExportError
    from attnserve.service.exports import ensure_export

    settings = _settings(args, "prepare")
    if isinstance(settings, int):
        return settings
    try:
        target = ensure_export(settings)
    except ExportError as exc:
        print(f"attnserve prepare: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"attnserve prepare: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"attnserve prepare: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(target)
    return 0


def serve_command(args) -> int:
    import uvicorn

    from attnserve.service.app import create_app, load_runner

    settings = _settings(args, "serve")
    if isinstance(settings, int):
        return settings
    from attnserve.service.runtime import ExportError
    from attnserve.service.tokenizer import TextTokenizer

    busy = port_in_use(settings.host, settings.port)
    if busy:  # before minutes of loading or exporting, and with a hint instead of uvicorn's "[Errno 98]"
        print(f"attnserve serve: cannot listen on {settings.host}:{settings.port}: {busy}; another server (attnserve?) "
              f"holds it: stop it, or pass --port N (ATTNSERVE_PORT) for a free port", file=sys.stderr)
        return 2
    try:
        # Before binding the port: a first start may export for minutes.
        runner, tokenizer_path = load_runner(settings)
        # Loaded here too so that a corrupt tokenizer.json is this message and exit status, not
        # a traceback from inside uvicorn's startup.
        TextTokenizer(tokenizer_path, settings.max_length)
    except ExportError as exc:  # a missing, corrupt or mismatched export: its message names the file
        print(f"attnserve serve: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # unknown variant or parameter, bad runtime setting
        print(f"attnserve serve: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # no export and no torch to make one, or the export failed
        print(f"attnserve serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    app = create_app(settings, runner=runner, tokenizer_path=tokenizer_path)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=settings.graceful_shutdown_timeout,
        access_log=settings.log_level == "debug",
    )
    return 0


def port_in_use(host: str, port: int) -> str | None:
    """Why (host, port) cannot be bound now, None when it can (port 0 always can)."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None  # uvicorn reports a bad host in its own words
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None
