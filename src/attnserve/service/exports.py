"""Where a deployment's export lives, and making it on first start.

models_dir holds one export per recipe (`attnserve export --print-recipe`: the variant's
resolved parameters, max_length, adapted weights, attnserve's code and the converters'
versions), named after its digest, so that changing any of them makes a new one and a default
spelled out does not.

Serving never imports attnserve.models (nor torch): the recipe and the export itself come from
`python -m attnserve.export.exporter` run as a child process, whose progress goes to this
process's output. Where torch is not installed, an export made elsewhere is found by its manifest.
"""
from __future__ import annotations

import codecs
import importlib.util
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from attnserve.contract.export_format import (  # noqa: F401 - WeightsError, WEIGHTS_FILE, META_FILE: this module's API
    DEFAULT_PRECISION, META_FILE, WEIGHTS_FILE, ExportError, Manifest, WeightsError, code_sha256, export_name, param_arg,
    read_manifest, sha256, weights_file)
from attnserve.contract.model_folder import DEFAULT_MODEL_NAME, describe_record, read_model_folder
from attnserve.contract.schedule import NUM_LAYERS, resolve_native, schedule_slug
from attnserve.service.settings import Settings

log = logging.getLogger("attnserve")

EXPORTER = [sys.executable, "-m", "attnserve.export.exporter"]
STDERR_TAIL_CHARS = 16_384  # what a failed export's message may quote of the exporter's stderr


class ExportMissing(RuntimeError):
    """No export where one was expected, and none can be made here."""


class ExportFailed(RuntimeError):
    """The exporter ran and did not finish an export; the message holds what it said."""


def weights_sha256(settings: Settings) -> str | None:
    """sha256 of the adapted weights file the settings name, None without --weights."""
    return sha256(weights_file(settings.weights)) if settings.weights is not None else None


def model_record(settings: Settings) -> dict | None:
    """The name and weights sha256 of the model folder --model names (ModelError, a ValueError
    naming the file, for one that is not a supported model); None without --model."""
    return read_model_folder(settings.model).record if settings.model is not None else None


def exporter_args(settings: Settings) -> list[str]:
    """The `attnserve export` arguments (less --out) that make the export these settings serve."""
    args = ["--variant", settings.variant, "--max-length", str(settings.max_length)]
    if settings.model is not None:
        args += ["--model", str(settings.model)]
    for key, value in settings.params.items():
        args += ["--param", param_arg(key, value)]
    if settings.precision != DEFAULT_PRECISION:
        args += ["--precision", settings.precision]
    return args + (["--weights", str(settings.weights)] if settings.weights is not None else [])


def _exporter_error(result: subprocess.CompletedProcess) -> str:
    """What a failed exporter said: its `attnserve export: error:` line, else its last lines."""
    lines = [line for line in (result.stderr or "").strip().splitlines() if line.strip()]
    said = [line.split("error: ", 1)[1] for line in lines if line.startswith("attnserve export: error: ")]
    return said[-1] if said else "\n".join(lines[-15:]) or f"exit status {result.returncode}"


def settings_recipe(settings: Settings) -> dict:
    """The export recipe these settings ask for, from the exporter (it knows the variant's
    defaults). ImportError where torch is not installed; ValueError for an unknown variant or
    parameter (the exporter's message); WeightsError for weights that are not there."""
    if importlib.util.find_spec("torch") is None:
        raise ImportError("No module named 'torch'")
    weights_sha256(settings)  # a missing weights file is refused here, as WeightsError
    model_record(settings)  # and a folder that is no supported model, as ModelError
    result = subprocess.run([*EXPORTER, *exporter_args(settings), "--print-recipe"], capture_output=True, text=True)
    if result.returncode != 0:
        raise ValueError(_exporter_error(result))
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_export(settings: Settings, out_dir: Path) -> None:
    """Export what the settings serve into out_dir with the exporter in a child process. Its
    output and its progress bar reach this process's stderr as they come (stdout stays this
    process's own: `attnserve prepare` prints only the export's folder there); the end of it is
    kept for the message of the ExportFailed raised when it fails."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tail = ""
    with subprocess.Popen([*EXPORTER, *exporter_args(settings), "--out", str(out_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as child:
        while chunk := child.stdout.read1(4096):
            text = decoder.decode(chunk)
            sys.stderr.write(text)
            sys.stderr.flush()
            tail = (tail + text)[-STDERR_TAIL_CHARS:]
        returncode = child.wait()
    if returncode != 0:
        said = subprocess.CompletedProcess(child.args, returncode, stderr=tail)
        raise ExportFailed(f"exporting {settings.variant} into {out_dir} failed: {_exporter_error(said)}")


def export_path(settings: Settings) -> Path:
    if settings.export_dir is not None:
        return settings.export_dir
    return settings.models_dir / export_name(settings_recipe(settings))


def check_export_fits(target: Path, settings: Settings) -> None:
    """An export given by export_dir must be of the model --model names, hold the weights
    --weights names, and be of the precision --precision names where one is named (a name
    under models_dir holds all three by construction)."""
    wanted = model_record(settings)
    if wanted is not None:
        made = read_manifest(target).model
        if made is None or made.sha256 != wanted["sha256"]:
            made_of = describe_record(made.model_dump() if made else None)
            raise ExportError(f"{target / 'manifest.json'}: exported from the model {made_of}, not {describe_record(wanted)} "
                              f"({settings.model}); export that model there with `attnserve export --model {settings.model}` "
                              f"or leave out export_dir")
        if getattr(made, "files_sha256", None) != wanted["files_sha256"]:
            raise ExportError(f"{target / 'manifest.json'}: exported from {settings.model} as its config.json, tokenizer.json, "
                              f"modules.json, pooling or sentence_bert_config.json were then (files sha256 "
                              f"{str(getattr(made, 'files_sha256', None))[:12]}, now {wanted['files_sha256'][:12]}); export it "
                              f"again with `attnserve export --model {settings.model}`, or leave out export_dir")
    precision = read_manifest(target).precision if "precision" in settings.model_fields_set else settings.precision
    if precision != settings.precision:
        raise ExportError(f"{target / 'manifest.json'}: exported in {precision}, not {settings.precision}; export it in "
                          f"{settings.precision} with `attnserve export --precision {settings.precision}`, or leave out "
                          f"--precision (an export directory serves the precision it was made in)")
    expected = weights_sha256(settings)
    if expected is None:
        return
    weights = read_manifest(target).weights
    recorded = weights.sha256 if weights else None
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
    if settings.export_dir is not None:
        target, recipe = settings.export_dir, None
    else:
        try:
            recipe = settings_recipe(settings)
        except ImportError as exc:  # no torch: serve a matching export made elsewhere, or say how to get one
            return cached_export_without_torch(settings, exc)
        target = settings.models_dir / export_name(recipe)
    if (target / "manifest.json").is_file():
        check_export_fits(target, settings)
        log.info("serving the export at %s (%s)", target, read_manifest(target).describe())
        return target
    check_export_target(target)
    # Before anything says "exporting": a serving-only install (no torch) never starts one, and
    # a bad variant or parameter is refused by the exporter before it builds anything.
    if recipe is None:
        try:
            recipe = settings_recipe(settings)
        except ImportError as exc:
            raise ExportMissing(
                f"no export at {target} (no manifest.json), and this install cannot make one ({exc}): export it where "
                f"the export extra is installed (pip install 'attnserve[export]') with `{export_command(settings)}`, "
                f"copy DIR here and serve it with --export-dir DIR"
            ) from exc
    log.warning("no export at %s: exporting %s (max_length %d, params %s, weights %s, %s); this runs once%s", target,
                settings.variant, settings.max_length, settings.params, settings.weights, settings.precision,
                why_not_cached(settings, recipe) if settings.export_dir is None else "")

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        raise ExportError(f"{target.parent}: cannot write there ({exc.strerror}); an export is written into a scratch "
                          f"folder beside {target.name} and renamed into place, so the folder above the export folder "
                          f"must be writable (a volume holds the export as a subfolder, not as its mount point)") from exc
    try:
        run_export(settings, scratch)
        try:
            # Replaces a missing or empty directory only: a non-empty one fails (ENOTEMPTY).
            os.replace(scratch, target)
        except OSError as exc:
            if not (target / "manifest.json").is_file():
                raise ExportError(f"{target}: cannot move the finished export there ({exc.strerror}); "
                                  f"pass an empty or new --export-dir") from exc
            # Another process finished the same export first: serve that one.
            shutil.rmtree(scratch, ignore_errors=True)
            check_export_fits(target, settings)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    log.warning("exported into %s; later starts serve it from there", target)  # the first warning's pair
    return target


def export_command(settings: Settings) -> str:
    """The `attnserve export` command line that makes the export these settings serve, into DIR."""
    return shlex.join(["attnserve", "export", *exporter_args(settings)]) + " --out DIR"


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


def served_schedule(settings: Settings) -> str:
    """The canonical text of the variant or schedule the settings serve, as an export records
    it: spelled for the model's layer count, `native` resolved to the model's own attention
    (torch-free: read from the model folder; the bundled model's pattern is full attention)."""
    if settings.model is None:
        return resolve_native(settings.variant, ("full",) * NUM_LAYERS)[0]
    folder = read_model_folder(settings.model)
    return resolve_native(settings.variant, folder.native_layers(), folder.local_window)[0]


def _cached(settings: Settings) -> list[tuple[Path, Manifest]]:
    """(directory, manifest) of each finished export under models_dir for this variant,
    max_length and precision, newest first. An own model's folders start with its name
    (export_name), hence the leading wildcard; the manifest says what each holds. Scratch
    folders of exports under way (".<name>-...") are not finished exports."""
    found = []
    variant = served_schedule(settings)
    for manifest_path in settings.models_dir.glob(f"*{schedule_slug(variant)}-L{settings.max_length}-*/manifest.json"):
        if manifest_path.parent.name.startswith("."):
            continue
        try:
            manifest = read_manifest(manifest_path.parent)
        except ExportError:
            continue
        if manifest.variant == variant and manifest.precision == settings.precision:
            found.append((manifest_path.parent, manifest))
    return sorted(found, key=lambda item: item[1].created or "", reverse=True)


def why_not_cached(settings: Settings, recipe: dict | None) -> str:
    """Why the exports already under models_dir for this variant and max_length do not serve
    these settings: the recipe entries in which the newest one differs."""
    if recipe is None:
        return ""
    cached = [(path, manifest.recipe) for path, manifest in _cached(settings)]
    if not cached:
        return ""
    path, old = cached[0]
    differ = [key for key in recipe if old.get(key) != recipe[key]]
    reasons = {"model": "another model, or its folder's files changed", "code_sha256": "attnserve's code changed", "attnserve": "attnserve was upgraded",
               "versions": "torch, onnx or onnxscript changed", "parameters": "other parameters", "weights_sha256": "other weights",
               "precision": "another precision"}
    return (f"; {path} does not fit: it differs in " + ", ".join(f"{key} ({reasons[key]})" if key in reasons else key for key in differ))


def recorded(parameters: dict, key: str, variant: str) -> set[str]:
    """The values a manifest's parameters hold for a setting's `key`, as text (empty when none
    has it): a schedule records each variant's own as variant.key, which a plain key sets in
    every variant that has it; `variant.key` of a plain variant is its key."""
    key = key.removeprefix(f"{variant}.")
    return {str(value) for name, value in parameters.items() if name == key or name.endswith(f".{key}")}


def cached_export_without_torch(settings: Settings, cause: ImportError) -> Path:
    """Without torch the variant's defaults are unknown, so the export is found by its
    manifest: the newest under models_dir with this model (--model's weights sha256, or the
    bundled model), variant, max_length, weights and this attnserve's code whose parameters
    agree with every one the settings name."""
    weights, code, model = weights_sha256(settings), code_sha256(), model_record(settings)
    for path, manifest in _cached(settings):
        recipe = manifest.recipe
        parameters = recipe.get("parameters") or {}
        made = recipe.get("model") or {"name": DEFAULT_MODEL_NAME}
        same_model = ({k: made.get(k) for k in ("sha256", "files_sha256")} == {k: model[k] for k in ("sha256", "files_sha256")}
                      if model else made.get("name") == DEFAULT_MODEL_NAME)
        if (same_model and recipe.get("weights_sha256") == weights and recipe.get("code_sha256") == code
                and all(recorded(parameters, key, manifest.variant) == {str(value)} for key, value in settings.params.items())):
            log.info("torch is not installed, so the export is chosen by its manifest: serving %s (%s)", path, manifest.describe())
            check_export_fits(path, settings)
            return path
    raise ExportMissing(
        f"no {settings.precision} export of {settings.variant} at {settings.max_length} tokens for this attnserve's code under {settings.models_dir}, "
        f"and exporting one needs torch and models/ (pip install 'attnserve[export]'): {cause}; or export on another machine "
        f"(`{export_command(settings)}`) and serve it with --export-dir DIR"
    )
