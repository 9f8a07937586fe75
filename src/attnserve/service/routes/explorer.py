"""GET /explorer: the attention explorer, a page of this service's own that draws /attention
(static files from src/attnserve/service/static/explorer, no build step), and what the page needs to start:
whether the API key is required and which peer servers compare mode may call."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from attnserve.service.errors import ServiceError

STATIC = Path(__file__).resolve().parent.parent / "static" / "explorer"
# The page's files by name: nothing else under the folder (or above it) is ever served.
FILES = {"explorer.js": "text/javascript", "explorer.css": "text/css", "samples.json": "application/json"}

router = APIRouter(tags=["explorer"], include_in_schema=False)


def peer_origins(peers: list[str]) -> list[str]:
    """scheme://host[:port] of each peer URL: the origins CORS lets call this server."""
    return sorted({f"{u.scheme}://{u.netloc}" for u in map(urlsplit, peers) if u.scheme and u.netloc})


@router.get("/explorer")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get("/explorer/config.json")
async def config(request: Request) -> JSONResponse:
    settings = request.app.state.settings
    return JSONResponse({"auth": settings.api_key is not None, "peers": [p.rstrip("/") for p in settings.explorer_peers]})


@router.get("/explorer/{name}")
async def static_file(name: str) -> FileResponse:
    if name not in FILES:
        raise ServiceError(404, f"no file {name!r} in the explorer: it has {', '.join(sorted(FILES))}", "not_found")
    return FileResponse(STATIC / name, media_type=FILES[name])
