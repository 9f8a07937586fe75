"""The attention variants, one module each (base.py: the signature they share; blocks.py: the
block-sparse kernel). attnserve.models.registry lists them by name."""
