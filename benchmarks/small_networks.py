"""Small CNNs from no zoo, written as ONNX files: where a newcomer starts (a small input, a
small budget). Built with the zoo's ONNX graph builder (seeded random weights, folded batch
norms), so nothing beyond stormdrop's own dependencies is needed.

- ``smallcnn``: the issue-40 shape of network: a 64x64 input, a 3x3 stem, depthwise and 1x1
  convolutions, a strided 3x3, a global average pool and a linear head. Used to choose the
  small-budget defaults: not held out.
- ``smallres``: held out. A 96x96 input, a strided stem, two residual 3x3 blocks (Winograd
  candidates at 48x48 and 24x24), 1x1 expansions and a max pool.
- ``smallmb``: held out. A 128x128 input, MobileNetV2-style inverted residuals (1x1 expand,
  depthwise 3x3, 1x1 project) with ReLU6, and the head.

    python benchmarks/small_networks.py --out /tmp/small   # writes /tmp/small/<name>.onnx
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import onnx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from stormdrop.workloads._onnx_builder import GraphBuilder  # noqa: E402


def _head(g: GraphBuilder, x: str, classes: int = 10) -> onnx.ModelProto:
    g.output(g.linear(g.flatten(g.global_avgpool(x)), classes, gain=0.5))
    return g.model()


def smallcnn(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("smallcnn", seed)
    x = g.input("input", (1, 3, 64, 64))
    x = g.conv_act(x, 16, 3)                    # 64x64 stem
    x = g.conv_act(x, 16, 3, groups=16)         # depthwise
    x = g.conv_act(x, 32, 1)                    # pointwise
    x = g.conv_act(x, 32, 3, 2)                 # 32x32, strided 3x3
    x = g.conv_act(x, 32, 3)                    # 3x3 (a Winograd candidate)
    x = g.conv_act(x, 32, 3, 2, groups=32)      # 16x16 depthwise, strided
    x = g.conv_act(x, 64, 1)
    return _head(g, x)


def smallres(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("smallres", seed)
    x = g.input("input", (1, 3, 96, 96))
    x = g.conv_act(x, 24, 3, 2)                 # 48x48
    for ch, stride in ((24, 1), (48, 2)):
        y = g.conv_act(x, ch, 3, stride)
        y = g.conv_act(y, ch, 3, act=None, gain=0.5)
        skip = x if stride == 1 else g.conv_act(x, ch, 1, stride, act=None)
        x = g.relu(g.add(y, skip))
    x = g.maxpool(x, 2, 2)                      # 12x12
    x = g.conv_act(x, 96, 1)
    return _head(g, x)


def smallmb(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder("smallmb", seed)
    x = g.input("input", (1, 3, 128, 128))
    x = g.conv_act(x, 16, 3, 2, act="relu6")    # 64x64
    for out, stride, expand in ((16, 1, 1), (24, 2, 4), (24, 1, 4), (40, 2, 4)):
        c = g.channels(x)
        y = g.conv_act(x, c * expand, 1, act="relu6") if expand != 1 else x
        y = g.conv_act(y, c * expand, 3, stride, groups=c * expand, act="relu6")
        y = g.conv_act(y, out, 1, act=None, gain=0.5)
        x = g.add(x, y) if stride == 1 and c == out else y
    x = g.conv_act(x, 128, 1, act="relu6")
    return _head(g, x)


NETWORKS: dict[str, Callable[[int], onnx.ModelProto]] = {"smallcnn": smallcnn, "smallres": smallres,
                                                          "smallmb": smallmb}
HELD_OUT = ("smallres", "smallmb")


def write(out: str, names: list[str] | None = None) -> list[str]:
    os.makedirs(out, exist_ok=True)
    paths = []
    for name in names or list(NETWORKS):
        path = os.path.join(out, f"{name}.onnx")
        onnx.save(NETWORKS[name](0), path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--only", default=None, help="comma-separated names (default: all)")
    args = p.parse_args(argv)
    for path in write(args.out, args.only.split(",") if args.only else None):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
