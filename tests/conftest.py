from pathlib import Path

import pytest
import torch

torch.manual_seed(0)


def pytest_sessionstart(session):
    """Once per run (in the controller, not in each pytest-xdist worker): drop exports of the
    suite's cache (tests/export_helpers.py) that no run has used for a while."""
    if not hasattr(session.config, "workerinput"):
        from export_helpers import prune_unused

        prune_unused()


# Files whose tests each stand alone and take long: pytest-xdist spreads them test by test.
SPREAD = {"test_export_parity", "test_encoder", "test_faults_startup"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (--dist loadgroup, pyproject's addopts) a group runs on one worker.
    Each test file is a group of its own, so that its module fixtures (a server, an export, a
    training run) are made once, except the SPREAD files; the files that need the machine to
    themselves share the group "whole_machine"."""
    for item in items:
        module = item.module.__name__
        if item.get_closest_marker("xdist_group") is None and module not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(module))


@pytest.fixture(scope="session")
def encoders():
    """One loaded encoder per (variant, max_length), shared by the tests."""
    from attnserve.models import load_encoder

    cache = {}

    def get(variant, max_length=4096, **params):
        key = (variant, max_length, tuple(sorted(params.items())))
        if key not in cache:
            cache[key] = load_encoder(variant, max_length=max_length, **params)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def export_dir() -> Path:
    """The HTTP tests' longformer export (max_length 1024), from the suite's export cache and
    found the way `attnserve serve --models-dir` finds it (its recipe's folder)."""
    from export_helpers import EXPORTS_ROOT, HTTP_MAX_LENGTH, HTTP_VARIANT, export_path

    from attnserve.service.exports import ensure_export
    from attnserve.service.settings import Settings

    cached = export_path(HTTP_VARIANT, HTTP_MAX_LENGTH)
    served = ensure_export(Settings(variant=HTTP_VARIANT, max_length=HTTP_MAX_LENGTH, models_dir=EXPORTS_ROOT))
    assert served == cached, f"serve looks for {served}, the cache made {cached}"
    return served


@pytest.fixture(scope="session")
def two_layer_minilm(tmp_path_factory) -> Path:
    """The bundled MiniLM cut to its first two layers (model_folders.minilm_folder), for the
    tests of a graph's faithfulness: the same weights every run, so its exports come from the
    suite's cache."""
    from model_folders import minilm_folder

    return minilm_folder(tmp_path_factory.mktemp("models") / "minilm-2-layers")
