"""A model zoo defined in code: classic networks as ONNX graphs with random weights.

Every image model follows the layer structure of torchvision's definition (eval mode: dropout
and auxiliary heads dropped, batch norm folded into the preceding convolution) with the widths
and depths of the paper. Input ``"input"`` is ``[batch, 3, R, R]`` float32, output ``"output"``
is ``[batch, 1000]``. ``bert_base`` is the BERT-base encoder stack over float32 hidden states
``[batch, seq, 768]`` (no embedding lookup, no attention mask) with output ``[batch, seq, 768]``.

Resolutions other than the paper's work from 32 up (inception_v3: from 75) because the
classifiers sit behind a global average pool, except for two cases:

* alexnet / vgg16 keep torchvision's three FC layers behind ``AdaptiveAvgPool2d(6)`` / ``(7)``.
  The adaptive pool is an ``AveragePool`` whose window is computed from the feature-map size at
  build time: ``stride = H // n``, ``kernel = H - (n - 1) * stride`` (exactly the adaptive pool
  when ``H`` is a multiple of ``n``, e.g. the identity at 224; an approximation otherwise). When
  the map is smaller than ``n`` (tiny resolutions) a ``GlobalAveragePool`` feeds a first FC
  layer with ``C`` inputs instead of ``C * n * n`` (for a 1x1 map this is the same function as
  torchvision's, whose adaptive pool replicates the pixel ``n * n`` times).
* pooling windows larger than the feature map (alexnet / densenet at tiny resolutions, where
  PyTorch would raise) are clamped to the map; this never happens at the paper resolutions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import onnx

from stormdrop.errors import SpecError
from stormdrop.workloads._networks import (
    alexnet,
    densenet,
    efficientnet_b0,
    efficientnet_b4,
    googlenet,
    inception_v3,
    mnasnet1_0,
    mobilenet_v2,
    resnet18,
    resnet34,
    resnet50,
    resnet101,
    resnet152,
    shufflenet_v2_x1_0,
    squeezenet1_0,
    vgg,
)
from stormdrop.workloads._transformers import bert_base, mobilebert


class ZooEntry(NamedTuple):
    builder: Callable[..., onnx.ModelProto]  # builder(batch, size, seed, **kw)
    input_shape: str  # the default input shape, described
    paper_size: int  # the paper's input resolution (bert_base: sequence length)


_IMG = "[batch, 3, {0}, {0}]"

ZOO: dict[str, ZooEntry] = {
    "resnet18": ZooEntry(resnet18, _IMG.format(224), 224),
    "resnet50": ZooEntry(resnet50, _IMG.format(224), 224),
    "mobilenet_v2": ZooEntry(mobilenet_v2, _IMG.format(224), 224),
    "vgg16": ZooEntry(partial(vgg, "vgg16"), _IMG.format(224), 224),
    "alexnet": ZooEntry(alexnet, _IMG.format(224), 224),
    "squeezenet1_0": ZooEntry(squeezenet1_0, _IMG.format(224), 224),
    "densenet121": ZooEntry(partial(densenet, "densenet121"), _IMG.format(224), 224),
    "inception_v3": ZooEntry(inception_v3, _IMG.format(299), 299),
    "googlenet": ZooEntry(googlenet, _IMG.format(224), 224),
    "mnasnet1_0": ZooEntry(mnasnet1_0, _IMG.format(224), 224),
    "efficientnet_b0": ZooEntry(efficientnet_b0, _IMG.format(224), 224),
    # the storm/raindrop and transfer-tuning papers' other networks
    "resnet34": ZooEntry(resnet34, _IMG.format(224), 224),
    "resnet101": ZooEntry(resnet101, _IMG.format(224), 224),
    "resnet152": ZooEntry(resnet152, _IMG.format(224), 224),
    "vgg11": ZooEntry(partial(vgg, "vgg11"), _IMG.format(224), 224),
    "vgg13": ZooEntry(partial(vgg, "vgg13"), _IMG.format(224), 224),
    "vgg19": ZooEntry(partial(vgg, "vgg19"), _IMG.format(224), 224),
    "densenet161": ZooEntry(partial(densenet, "densenet161"), _IMG.format(224), 224),
    "densenet169": ZooEntry(partial(densenet, "densenet169"), _IMG.format(224), 224),
    "densenet201": ZooEntry(partial(densenet, "densenet201"), _IMG.format(224), 224),
    "shufflenet_v2_x1_0": ZooEntry(shufflenet_v2_x1_0, _IMG.format(224), 224),
    "efficientnet_b4": ZooEntry(efficientnet_b4, _IMG.format(380), 380),
    "mobilebert": ZooEntry(mobilebert, "[batch, 256, 512] (float32 hidden states)", 256),
    "bert_base": ZooEntry(bert_base, "[batch, 128, 768] (float32 hidden states)", 128),
}

_MIN_RESOLUTION = {"inception_v3": 75}  # others: 32
SEQUENCE_MODELS = {"bert_base": 12, "mobilebert": 24}  # take seq_len and layers (their default layers)


def zoo_names() -> list[str]:
    return list(ZOO)


def min_resolution(name: str) -> int:
    return _MIN_RESOLUTION.get(name, 32)


def build_zoo_model(
    name: str,
    *,
    batch: int = 1,
    resolution: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    layers: int | None = None,
) -> onnx.ModelProto:
    """Build zoo model ``name`` with random weights from ``seed``.

    ``resolution`` (image models) defaults to the paper's; ``seq_len`` and ``layers``
    (``bert_base`` only) default to 128 and 12.
    """
    entry = ZOO.get(name)
    if entry is None:
        raise SpecError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}")
    if not isinstance(batch, int) or batch < 1:
        raise SpecError(f"zoo model {name}: batch must be a positive integer, got {batch!r}")
    if name in SEQUENCE_MODELS:
        if resolution is not None:
            raise SpecError(f"zoo model {name} takes seq_len, not resolution")
        seq = entry.paper_size if seq_len is None else seq_len
        if not isinstance(seq, int) or seq < 1:
            raise SpecError(f"zoo model {name}: seq_len must be a positive integer, got {seq!r}")
        n_layers = SEQUENCE_MODELS[name] if layers is None else layers
        if not isinstance(n_layers, int) or n_layers < 1:
            raise SpecError(f"zoo model {name}: layers must be a positive integer, got {layers!r}")
        return entry.builder(batch, seq, seed, layers=n_layers)
    if seq_len is not None or layers is not None:
        raise SpecError(f"zoo model {name} takes resolution, not seq_len/layers")
    res = entry.paper_size if resolution is None else resolution
    lo = min_resolution(name)
    if not isinstance(res, int) or res < lo:
        raise SpecError(f"zoo model {name}: resolution must be an integer >= {lo}, got {res!r}")
    return entry.builder(batch, res, seed)


def export_zoo_model(name: str, path: str | os.PathLike, **kw) -> None:
    """Build zoo model ``name`` (keywords as :func:`build_zoo_model`) and save it to ``path``."""
    onnx.save(build_zoo_model(name, **kw), os.fspath(path))
