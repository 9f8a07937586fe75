"""attnserve's models: the long-context encoder and its registry of attention variants.

The names below load on first use (PEP 562), so importing a torch-free module of this package
(`attnserve.models.schedule`) does not import torch.
"""
import importlib

_EXPORTS = {"Encoder": "api", "load_encoder": "api", "parameters": "registry", "variant_names": "registry"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
