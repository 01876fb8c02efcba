"""The zoo's image networks, one builder function each (see ``zoo`` for the conventions; the
sequence models are in ``_transformers``)."""

from __future__ import annotations

import math

import onnx

from stormdrop.workloads._onnx_builder import GraphBuilder

NUM_CLASSES = 1000
RESIDUAL_GAIN = 0.3  # He gain of the last conv of a residual branch (keeps sums O(1))


def _image_input(name: str, batch: int, res: int, seed: int) -> tuple[GraphBuilder, str]:
    g = GraphBuilder(name, seed)
    return g, g.input("input", (batch, 3, res, res))


def _classifier(g: GraphBuilder, x: str) -> onnx.ModelProto:
    """Global average pool, flatten, Linear(C, 1000)."""
    x = g.flatten(g.global_avgpool(x))
    g.output(g.linear(x, NUM_CLASSES, gain=0.5))
    return g.model()


# ------------------------------------------------------------------------------ ResNet


def _basic_block(g: GraphBuilder, x: str, planes: int, stride: int) -> str:
    identity = x
    out = g.conv_act(x, planes, 3, stride, 1)
    out = g.conv_act(out, planes, 3, 1, 1, act=None, gain=RESIDUAL_GAIN)
    if stride != 1 or g.channels(x) != planes:
        identity = g.conv_act(x, planes, 1, stride, 0, act=None)
    return g.relu(g.add(out, identity))


def _bottleneck(g: GraphBuilder, x: str, planes: int, stride: int) -> str:
    identity = x
    out = g.conv_act(x, planes, 1, 1, 0)
    out = g.conv_act(out, planes, 3, stride, 1)  # ResNet v1.5: stride on the 3x3
    out = g.conv_act(out, planes * 4, 1, 1, 0, act=None, gain=RESIDUAL_GAIN)
    if stride != 1 or g.channels(x) != planes * 4:
        identity = g.conv_act(x, planes * 4, 1, stride, 0, act=None)
    return g.relu(g.add(out, identity))


def _resnet(name, block, layers, batch, res, seed):
    g, x = _image_input(name, batch, res, seed)
    x = g.conv_act(x, 64, 7, 2, 3)
    x = g.maxpool(x, 3, 2, 1)
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers)):
        for j in range(n):
            x = block(g, x, planes, 2 if (i > 0 and j == 0) else 1)
    return _classifier(g, x)


def resnet18(batch: int, res: int, seed: int) -> onnx.ModelProto:
    return _resnet("resnet18", _basic_block, (2, 2, 2, 2), batch, res, seed)


def resnet34(batch: int, res: int, seed: int) -> onnx.ModelProto:
    return _resnet("resnet34", _basic_block, (3, 4, 6, 3), batch, res, seed)


def resnet50(batch: int, res: int, seed: int) -> onnx.ModelProto:
    return _resnet("resnet50", _bottleneck, (3, 4, 6, 3), batch, res, seed)


def resnet101(batch: int, res: int, seed: int) -> onnx.ModelProto:
    return _resnet("resnet101", _bottleneck, (3, 4, 23, 3), batch, res, seed)


def resnet152(batch: int, res: int, seed: int) -> onnx.ModelProto:
    return _resnet("resnet152", _bottleneck, (3, 8, 36, 3), batch, res, seed)


# ------------------------------------------------------------------------------ MobileNetV2


def mobilenet_v2(batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input("mobilenet_v2", batch, res, seed)
    x = g.conv_act(x, 32, 3, 2, act="relu6")
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    for t, c, n, s in settings:
        for i in range(n):
            stride = s if i == 0 else 1
            inp = g.channels(x)
            h = x
            if t != 1:
                h = g.conv_act(h, inp * t, 1, act="relu6")
            h = g.conv_act(h, inp * t, 3, stride, groups=inp * t, act="relu6")
            residual = stride == 1 and inp == c
            h = g.conv_act(h, c, 1, act=None, gain=RESIDUAL_GAIN if residual else 1.0)
            x = g.add(x, h) if residual else h
    x = g.conv_act(x, 1280, 1, act="relu6")
    return _classifier(g, x)


# ------------------------------------------------------------------------------ AlexNet / VGG


def _adaptive_fc_head(g: GraphBuilder, x: str, n: int, hidden: int) -> onnx.ModelProto:
    """AdaptiveAvgPool2d(n) + flatten + Linear/ReLU/Linear/ReLU/Linear (see module doc)."""
    _, _, h, w = g.shape(x)
    if min(h, w) >= n:
        if (h, w) != (n, n):
            sh, sw = h // n, w // n
            x = g.avgpool(x, (h - (n - 1) * sh, w - (n - 1) * sw), (sh, sw))
        x = g.flatten(x)
    else:
        x = g.flatten(g.global_avgpool(x))
    x = g.relu(g.linear(x, hidden))
    x = g.relu(g.linear(x, hidden))
    g.output(g.linear(x, NUM_CLASSES, gain=0.5))
    return g.model()


def alexnet(batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input("alexnet", batch, res, seed)
    x = g.conv_act(x, 64, 11, 4, 2)
    x = g.maxpool(x, 3, 2)
    x = g.conv_act(x, 192, 5, 1, 2)
    x = g.maxpool(x, 3, 2)
    x = g.conv_act(x, 384, 3, 1, 1)
    x = g.conv_act(x, 256, 3, 1, 1)
    x = g.conv_act(x, 256, 3, 1, 1)
    x = g.maxpool(x, 3, 2)
    return _adaptive_fc_head(g, x, 6, 4096)


_VGG = {  # convolutions per stage of 64, 128, 256, 512, 512 channels (torchvision's configs A, B, D, E)
    "vgg11": (1, 1, 2, 2, 2), "vgg13": (2, 2, 2, 2, 2), "vgg16": (2, 2, 3, 3, 3), "vgg19": (2, 2, 4, 4, 4)}


def vgg(name: str, batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input(name, batch, res, seed)
    for width, n in zip((64, 128, 256, 512, 512), _VGG[name]):
        for _ in range(n):
            x = g.conv_act(x, width, 3, 1, 1)
        x = g.maxpool(x, 2, 2)
    return _adaptive_fc_head(g, x, 7, 4096)


# ------------------------------------------------------------------------------ SqueezeNet


def _fire(g: GraphBuilder, x: str, squeeze: int, e1: int, e3: int) -> str:
    s = g.conv_act(x, squeeze, 1)
    return g.concat([g.conv_act(s, e1, 1), g.conv_act(s, e3, 3, 1, 1)])


def squeezenet1_0(batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input("squeezenet1_0", batch, res, seed)
    x = g.conv_act(x, 96, 7, 2, 0)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = _fire(g, x, 16, 64, 64)
    x = _fire(g, x, 16, 64, 64)
    x = _fire(g, x, 32, 128, 128)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = _fire(g, x, 32, 128, 128)
    x = _fire(g, x, 48, 192, 192)
    x = _fire(g, x, 48, 192, 192)
    x = _fire(g, x, 64, 256, 256)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = _fire(g, x, 64, 256, 256)
    # classifier: Dropout, Conv1x1(512, 1000), ReLU, AdaptiveAvgPool2d(1), flatten
    x = g.conv_act(x, NUM_CLASSES, 1, gain=0.5)
    g.output(g.flatten(g.global_avgpool(x)))
    return g.model()


# ------------------------------------------------------------------------------ DenseNet


_DENSENET = {  # (growth, initial features, layers per block), torchvision's
    "densenet121": (32, 64, (6, 12, 24, 16)), "densenet161": (48, 96, (6, 12, 36, 24)),
    "densenet169": (32, 64, (6, 12, 32, 32)), "densenet201": (32, 64, (6, 12, 48, 32))}


def densenet(name: str, batch: int, res: int, seed: int) -> onnx.ModelProto:
    """DenseNet (bn_size 4). The pre-activation BNs act on concatenated features, so with
    random weights they are dropped (not folded)."""
    g, x = _image_input(name, batch, res, seed)
    growth, features, blocks = _DENSENET[name]
    bn_size = 4
    x = g.conv_act(x, features, 7, 2, 3)
    x = g.maxpool(x, 3, 2, 1)
    for i, n_layers in enumerate(blocks):
        for _ in range(n_layers):
            y = g.conv(g.relu(x), bn_size * growth, 1, bias=False)
            y = g.conv(g.relu(y), growth, 3, 1, 1, bias=False)
            x = g.concat([x, y])
        if i != 3:  # transition: ReLU, Conv1x1(C -> C/2), AvgPool(2, 2)
            y = g.conv(g.relu(x), g.channels(x) // 2, 1, bias=False)
            x = g.avgpool(y, 2, 2)
    return _classifier(g, g.relu(x))


# ------------------------------------------------------------------------------ GoogLeNet


def _inception_v1(g, x, c1, c3r, c3, c5r, c5, pool_proj) -> str:
    b1 = g.conv_act(x, c1, 1)
    b2 = g.conv_act(g.conv_act(x, c3r, 1), c3, 3)
    b3 = g.conv_act(g.conv_act(x, c5r, 1), c5, 3)  # torchvision uses 3x3 here, not 5x5
    b4 = g.conv_act(g.maxpool(x, 3, 1, 1, ceil_mode=True), pool_proj, 1)
    return g.concat([b1, b2, b3, b4])


def googlenet(batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input("googlenet", batch, res, seed)
    x = g.conv_act(x, 64, 7, 2, 3)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = g.conv_act(x, 64, 1)
    x = g.conv_act(x, 192, 3, 1, 1)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = _inception_v1(g, x, 64, 96, 128, 16, 32, 32)
    x = _inception_v1(g, x, 128, 128, 192, 32, 96, 64)
    x = g.maxpool(x, 3, 2, ceil_mode=True)
    x = _inception_v1(g, x, 192, 96, 208, 16, 48, 64)
    x = _inception_v1(g, x, 160, 112, 224, 24, 64, 64)
    x = _inception_v1(g, x, 128, 128, 256, 24, 64, 64)
    x = _inception_v1(g, x, 112, 144, 288, 32, 64, 64)
    x = _inception_v1(g, x, 256, 160, 320, 32, 128, 128)
    x = g.maxpool(x, 2, 2, ceil_mode=True)
    x = _inception_v1(g, x, 256, 160, 320, 32, 128, 128)
    x = _inception_v1(g, x, 384, 192, 384, 48, 128, 128)
    return _classifier(g, x)


# ------------------------------------------------------------------------------ Inception v3


def _inc_a(g, x, pool_features) -> str:
    b1 = g.conv_act(x, 64, 1)
    b5 = g.conv_act(g.conv_act(x, 48, 1), 64, 5)
    b3 = g.conv_act(g.conv_act(g.conv_act(x, 64, 1), 96, 3), 96, 3)
    bp = g.conv_act(g.avgpool(x, 3, 1, 1), pool_features, 1)
    return g.concat([b1, b5, b3, bp])


def _inc_b(g, x) -> str:
    b3 = g.conv_act(x, 384, 3, 2, 0)
    bd = g.conv_act(g.conv_act(g.conv_act(x, 64, 1), 96, 3), 96, 3, 2, 0)
    return g.concat([b3, bd, g.maxpool(x, 3, 2)])


def _inc_c(g, x, c7) -> str:
    b1 = g.conv_act(x, 192, 1)
    b7 = g.conv_act(g.conv_act(g.conv_act(x, c7, 1), c7, (1, 7)), 192, (7, 1))
    bd = g.conv_act(x, c7, 1)
    for out, k in ((c7, (7, 1)), (c7, (1, 7)), (c7, (7, 1)), (192, (1, 7))):
        bd = g.conv_act(bd, out, k)
    bp = g.conv_act(g.avgpool(x, 3, 1, 1), 192, 1)
    return g.concat([b1, b7, bd, bp])


def _inc_d(g, x) -> str:
    b3 = g.conv_act(g.conv_act(x, 192, 1), 320, 3, 2, 0)
    b7 = g.conv_act(x, 192, 1)
    for k in ((1, 7), (7, 1)):
        b7 = g.conv_act(b7, 192, k)
    b7 = g.conv_act(b7, 192, 3, 2, 0)
    return g.concat([b3, b7, g.maxpool(x, 3, 2)])


def _inc_e(g, x) -> str:
    b1 = g.conv_act(x, 320, 1)
    b3 = g.conv_act(x, 384, 1)
    b3 = g.concat([g.conv_act(b3, 384, (1, 3)), g.conv_act(b3, 384, (3, 1))])
    bd = g.conv_act(g.conv_act(x, 448, 1), 384, 3)
    bd = g.concat([g.conv_act(bd, 384, (1, 3)), g.conv_act(bd, 384, (3, 1))])
    bp = g.conv_act(g.avgpool(x, 3, 1, 1), 192, 1)
    return g.concat([b1, b3, bd, bp])


def inception_v3(batch: int, res: int, seed: int) -> onnx.ModelProto:
    """Inception v3 without the auxiliary classifier (eval mode)."""
    g, x = _image_input("inception_v3", batch, res, seed)
    x = g.conv_act(x, 32, 3, 2, 0)
    x = g.conv_act(x, 32, 3, 1, 0)
    x = g.conv_act(x, 64, 3, 1, 1)
    x = g.maxpool(x, 3, 2)
    x = g.conv_act(x, 80, 1)
    x = g.conv_act(x, 192, 3, 1, 0)
    x = g.maxpool(x, 3, 2)
    for pf in (32, 64, 64):
        x = _inc_a(g, x, pf)
    x = _inc_b(g, x)
    for c7 in (128, 160, 160, 192):
        x = _inc_c(g, x, c7)
    x = _inc_d(g, x)
    x = _inc_e(g, x)
    x = _inc_e(g, x)
    return _classifier(g, x)


# ------------------------------------------------------------------------------ MnasNet / EfficientNet


def mnasnet1_0(batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input("mnasnet1_0", batch, res, seed)
    x = g.conv_act(x, 32, 3, 2)
    x = g.conv_act(x, 32, 3, 1, groups=32)
    x = g.conv_act(x, 16, 1, act=None)
    # (out, kernel, stride, expansion, repeats)
    for out, k, s, e, n in ((24, 3, 2, 3, 3), (40, 5, 2, 3, 3), (80, 5, 2, 6, 3),
                            (96, 3, 1, 6, 2), (192, 5, 2, 6, 4), (320, 3, 1, 6, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            inp = g.channels(x)
            mid = inp * e
            residual = stride == 1 and inp == out
            h = g.conv_act(x, mid, 1)
            h = g.conv_act(h, mid, k, stride, groups=mid)
            h = g.conv_act(h, out, 1, act=None, gain=RESIDUAL_GAIN if residual else 1.0)
            x = g.add(h, x) if residual else h
    x = g.conv_act(x, 1280, 1)
    return _classifier(g, x)


def _divisible(v: float, d: int = 8) -> int:
    """torchvision's _make_divisible: the nearest multiple of d, never 10% below v."""
    out = max(d, int(v + d / 2) // d * d)
    return out + d if out < 0.9 * v else out


def efficientnet_b0(batch: int, res: int, seed: int) -> onnx.ModelProto:
    return _efficientnet("efficientnet_b0", 1.0, 1.0, batch, res, seed)


def efficientnet_b4(batch: int, res: int, seed: int) -> onnx.ModelProto:
    return _efficientnet("efficientnet_b4", 1.4, 1.8, batch, res, seed)


def _efficientnet(name: str, width: float, depth: float, batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input(name, batch, res, seed)
    # SiLU keeps less of its input's energy than ReLU; a He gain of 1.25 on the SiLU convs keeps
    # the random logits O(1) at 224 (the SE gates and SiLU make this network gain-sensitive)
    silu_gain = 1.25
    x = g.conv_act(x, _divisible(32 * width), 3, 2, act="silu", gain=silu_gain)
    # (expand, kernel, stride, out, layers) of B0, scaled by width and depth; stochastic depth
    # is the identity in eval mode
    for t, k, s, out, n in ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2),
                            (6, 3, 2, 80, 3), (6, 5, 1, 112, 3), (6, 5, 2, 192, 4),
                            (6, 3, 1, 320, 1)):
        out = _divisible(out * width)
        for i in range(math.ceil(n * depth)):
            stride = s if i == 0 else 1
            inp = g.channels(x)
            mid = _divisible(inp * t)
            residual = stride == 1 and inp == out
            h = x if mid == inp else g.conv_act(x, mid, 1, act="silu", gain=silu_gain)
            h = g.conv_act(h, mid, k, stride, groups=mid, act="silu", gain=silu_gain)
            h = g.squeeze_excite(h, max(1, inp // 4), act="silu")
            h = g.conv_act(h, out, 1, act=None, gain=RESIDUAL_GAIN if residual else 1.0)
            x = g.add(h, x) if residual else h
    x = g.conv_act(x, 4 * g.channels(x), 1, act="silu", gain=silu_gain)
    return _classifier(g, x)


# ------------------------------------------------------------------------------ ShuffleNetV2


def _shuffle(g: GraphBuilder, x: str) -> str:
    """Channel shuffle with 2 groups: [N, 2, C/2, H, W] -> transpose -> [N, C, H, W]."""
    n, c, h, w = g.shape(x)
    y = g.transpose(g.reshape(x, (n, 2, c // 2, h, w)), (0, 2, 1, 3, 4))
    return g.reshape(y, (n, c, h, w))


def shufflenet_v2_x1_0(batch: int, res: int, seed: int) -> onnx.ModelProto:
    g, x = _image_input("shufflenet_v2_x1_0", batch, res, seed)
    x = g.conv_act(x, 24, 3, 2, 1)
    x = g.maxpool(x, 3, 2, 1)
    for out, repeats in ((116, 4), (232, 8), (464, 4)):
        half = out // 2
        for i in range(repeats):
            if i == 0:  # stride 2: both branches see the whole input
                inp = g.channels(x)
                b1 = g.conv_act(g.conv_act(x, inp, 3, 2, 1, groups=inp, act=None), half, 1)
                b2 = g.conv_act(x, half, 1)
                b2 = g.conv_act(g.conv_act(b2, half, 3, 2, 1, groups=half, act=None), half, 1)
            else:  # stride 1: half the channels pass, the other half goes through the branch
                b1 = g.slice_channels(x, 0, half)
                b2 = g.conv_act(g.slice_channels(x, half, 2 * half), half, 1)
                b2 = g.conv_act(g.conv_act(b2, half, 3, 1, 1, groups=half, act=None), half, 1)
            x = _shuffle(g, g.concat([b1, b2]))
    x = g.conv_act(x, 1024, 1)
    return _classifier(g, x)
