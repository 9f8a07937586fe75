"""Where a deployment's export lives, and making it on first start.

models_dir holds one export per (variant, params, max_length), named so that changing any of
them makes a new one. Exporting needs torch and models/, imported only here and only when no
export exists yet.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from service.settings import Settings

log = logging.getLogger("attnserve")


class ExportMissing(RuntimeError):
    """No export where one was expected, and none can be made here."""


def export_name(variant: str, params: dict, max_length: int) -> str:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{variant}-L{max_length}-{digest}"


def export_path(settings: Settings) -> Path:
    if settings.export_dir is not None:
        return settings.export_dir
    return settings.models_dir / export_name(settings.variant, settings.params, settings.max_length)


def ensure_export(settings: Settings) -> Path:
    """The export directory to serve, exporting it first when it has no manifest.json yet.
    The export is written to a temporary directory beside it and renamed into place, so an
    interrupted export never looks finished."""
    target = export_path(settings)
    if (target / "manifest.json").is_file():
        return target
    log.warning("no export at %s: exporting %s (max_length %d, params %s); this runs once", target, settings.variant, settings.max_length, settings.params)
    try:
        from models.export import export_model  # torch: only when exporting
    except ImportError as exc:
        raise ExportMissing(
            f"no export at {target} (no manifest.json), and exporting one needs torch and models/ "
            f"(pip install 'attnserve[export]'): {exc}"
        ) from exc

    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        export_model(settings.variant, dict(settings.params), settings.max_length, scratch)
        if target.exists():  # a directory without a manifest: a leftover, replace it
            shutil.rmtree(target)
        os.replace(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target
