"""Where a deployment's export lives, and making it on first start.

models_dir holds one export per (variant, params, max_length, adapted weights), named so that
changing any of them makes a new one. Exporting needs torch and models/, imported only here and
only when no export exists yet.

Adapted weights (`attnserve adapt --out DIR`) are found by the file names below; models.weights
reads and writes them with the same names, so serving an existing export never needs torch.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from service.runtime import ExportError, read_manifest, sha256
from service.settings import Settings

log = logging.getLogger("attnserve")


WEIGHTS_FILE = "weights.safetensors"
META_FILE = "adapt.json"


class ExportMissing(RuntimeError):
    """No export where one was expected, and none can be made here."""


class WeightsError(ValueError):
    """Adapted weights that cannot be applied; the message names the file and what to change."""


def weights_file(weights_dir) -> Path:
    """DIR/weights.safetensors, checked to exist (WeightsError naming what is missing)."""
    weights_dir = Path(weights_dir)
    if not weights_dir.is_dir():
        raise WeightsError(f"{weights_dir}: no such weights directory; pass a directory written by `attnserve adapt --out DIR`")
    path = weights_dir / WEIGHTS_FILE
    if not path.is_file():
        raise WeightsError(f"{path}: missing; a weights directory holds {WEIGHTS_FILE} (and {META_FILE}) "
                           f"as `attnserve adapt --out DIR` writes them")
    return path


def export_name(variant: str, params: dict, max_length: int, weights_sha256: str | None = None) -> str:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{variant}-L{max_length}-{digest}" + (f"-w{weights_sha256[:10]}" if weights_sha256 else "")


def weights_sha256(settings: Settings) -> str | None:
    """sha256 of the adapted weights file the settings name, None without --weights."""
    return sha256(weights_file(settings.weights)) if settings.weights is not None else None


def export_path(settings: Settings) -> Path:
    if settings.export_dir is not None:
        return settings.export_dir
    return settings.models_dir / export_name(settings.variant, settings.params, settings.max_length, weights_sha256(settings))


def check_export_weights(target: Path, settings: Settings) -> None:
    """An export given by export_dir must hold the weights --weights names (a name under
    models_dir holds them by construction)."""
    expected = weights_sha256(settings)
    if expected is None:
        return
    recorded = (read_manifest(target).get("weights") or {}).get("sha256")
    if recorded != expected:
        had = f"with weights {recorded[:10]}" if recorded else "without adapted weights"
        raise WeightsError(
            f"{target / 'manifest.json'}: exported {had}, not with {settings.weights / WEIGHTS_FILE} ({expected[:10]}); "
            f"export them there with `attnserve export --weights {settings.weights}` or leave out export_dir"
        )


def ensure_export(settings: Settings) -> Path:
    """The export directory to serve, exporting it first when it has no manifest.json yet.

    A directory without manifest.json is exported into only when it is empty: anything else
    in it is not ours, so it is refused (ExportError) before any work and never deleted. The
    export is written to a scratch directory beside the target and renamed into place, so an
    interrupted export never looks finished; that scratch directory is the only thing this
    ever removes."""
    target = export_path(settings)
    if (target / "manifest.json").is_file():
        check_export_weights(target, settings)
        return target
    check_export_target(target)
    log.warning("no export at %s: exporting %s (max_length %d, params %s, weights %s); this runs once", target, settings.variant,
                settings.max_length, settings.params, settings.weights)
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
        export_model(settings.variant, dict(settings.params), settings.max_length, scratch, weights=settings.weights)
        try:
            # Replaces a missing or empty directory only: a non-empty one fails (ENOTEMPTY).
            os.replace(scratch, target)
        except OSError as exc:
            if not (target / "manifest.json").is_file():
                raise ExportError(f"{target}: cannot move the finished export there ({exc.strerror}); "
                                  f"pass an empty or new --export-dir") from exc
            # Another process finished the same export first: serve that one.
            shutil.rmtree(scratch, ignore_errors=True)
            check_export_weights(target, settings)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target


def check_export_target(target: Path) -> None:
    """A directory to export into must be missing or empty (ExportError otherwise)."""
    if target.exists() and not target.is_dir():
        raise ExportError(f"{target}: not a directory; pass a directory for the export (an empty or new one to export into)")
    if target.is_dir() and any(target.iterdir()):
        raise ExportError(
            f"{target}: not empty and has no manifest.json, so it is not an attnserve export; "
            f"attnserve exports only into an empty or new directory and never deletes files it did not write: "
            f"pass an empty or new --export-dir, or move the files out of {target}"
        )
