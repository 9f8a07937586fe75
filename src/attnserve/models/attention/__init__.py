"""One module per attention variant; importing this package registers them all."""
from attnserve.models.attention import (  # noqa: F401  (imported for registration, in table order)
    full,
    local,
    strided,
    global_tokens,
    longformer,
    bigbird,
    lsh,
    sinkhorn,
    linformer,
    compressed,
    synthesizer,
)
