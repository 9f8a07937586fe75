"""The model-side CLI: `attnserve variants` and the quality metric."""
import subprocess
import sys

import torch

from models import parameters, variant_names
from models.quality import mean_reciprocal_rank


def test_variants_lists_every_variant_with_parameters_and_cost():
    out = subprocess.run([sys.executable, "-m", "service.cli", "variants"], capture_output=True, text=True, check=True).stdout
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert list(lines) == variant_names()
    assert "O(N^2)" in lines["full"] and "O(N * window)" in lines["local"]
    for name in variant_names():
        for key, default in parameters(name).items():
            assert f"{key}={default!r}" in lines[name]


def test_mean_reciprocal_rank():
    docs = torch.eye(3)
    assert mean_reciprocal_rank(docs, docs) == 1.0
    swapped = docs[[1, 0, 2]]  # queries 0 and 1 rank their document second
    assert abs(mean_reciprocal_rank(swapped, docs) - (0.5 + 0.5 + 1) / 3) < 1e-6
