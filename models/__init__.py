"""attnserve's models: the long-context encoder and its registry of attention variants."""
from attnserve.models.api import Encoder, load_encoder
from attnserve.models.registry import parameters, variant_names

__all__ = ["Encoder", "load_encoder", "parameters", "variant_names"]
