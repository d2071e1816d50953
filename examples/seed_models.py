"""Model factories for `kevin prewarm --model examples/seed_models.py:NAME`: the example models at
benchmark size on the GPU, each returning (model, example_inputs). The seed cache in
kernels_cache/ is made from these (see kernels_cache/README.md)."""

from __future__ import annotations

import torch

from kevin_backend.example_models import make_example


def _on_gpu(name: str):  # noqa: ANN202
    return make_example(name, device="cuda" if torch.cuda.is_available() else "cpu", size="large")


def mlp():  # noqa: ANN201
    return _on_gpu("mlp")


def cnn():  # noqa: ANN201
    return _on_gpu("cnn")


def transformer():  # noqa: ANN201
    return _on_gpu("transformer")
