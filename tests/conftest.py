import pytest
import torch

torch.manual_seed(0)


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
