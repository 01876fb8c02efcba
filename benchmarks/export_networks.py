"""Real networks as users get them: torchvision, timm and Hugging Face definitions with random
weights, exported to ONNX by PyTorch's default exporter (``torch.onnx.export`` as it is called
with no exporter option). Nothing is downloaded: every network is built from its config.

Two sets:

- ``full``: the real-export benchmark's networks at their usual sizes (``bench_models.py
  --models DIR/a.onnx,...``);
- ``small``: mobile-style networks at 96x96 (``--size``) for the small-budget benchmark
  (``bench_small.py --cases DIR/a.onnx:128,...``), in no other set;
- ``fixtures``: the same families in tiny configurations, committed under
  ``tests/fixtures/exports/`` so that CI checks the importer paths these exporters produce
  (``Gelu``, ``LayerNormalization``, attention masks, int64 inputs, grouped convolutions, SE
  blocks, hardswish, SiLU) without installing PyTorch.

    python benchmarks/export_networks.py --set fixtures --out tests/fixtures/exports
    python benchmarks/export_networks.py --set full --out /tmp/exports [--only convnext_tiny,distilbert]
    python benchmarks/export_networks.py --set small --out /tmp/small [--size 128]

Needs ``torch``, ``torchvision``, ``timm``, ``transformers`` and ``onnxscript`` (not stormdrop's
dependencies). With a CPU-only ``torch``, torchvision's compiled operators (detection ops, which
no network here uses) may not load: their registrations are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from collections.abc import Callable

NETWORKS: dict[str, dict[str, Callable]] = {}


def network(name: str, kind: str) -> Callable:
    def register(build: Callable) -> Callable:
        NETWORKS.setdefault(kind, {})[name] = build
        return build

    return register


def _torchvision():
    try:
        import torchvision
    except RuntimeError:  # a CUDA torchvision beside a CPU-only torch: its detection ops cannot load
        for mod in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[mod]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    return torchvision


def _image(size: int):
    import torch

    return (torch.randn(1, 3, size, size),), ["input"]


def _tokens(vocab: int, seq: int, token_types: bool = False):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, seq), generator=g)
    mask = torch.ones(1, seq, dtype=torch.int64)
    mask[0, seq - seq // 4:] = 0  # padded tail: the mask is used
    kwargs = {"input_ids": ids, "attention_mask": mask}  # by name: GPT-2's second argument is its cache
    if token_types:
        kwargs["token_type_ids"] = torch.zeros(1, seq, dtype=torch.int64)
    return kwargs, list(kwargs)


SMALL_SIZE = [96]  # the small set's input size (--size)


# ---- full size -----------------------------------------------------------------------------------
@network("regnet_x_400mf", "small")
def _regnet_x_400mf():
    return _torchvision().models.regnet_x_400mf(), _image(SMALL_SIZE[0])


def _squeezenet1_1():
    return _torchvision().models.squeezenet1_1(), _image(SMALL_SIZE[0])


def _timm_small(name: str):
    import timm

    return timm.create_model(name, pretrained=False), _image(SMALL_SIZE[0])


# timm: ghost modules, mixed-kernel depthwise, hardswish; then mobile NAS networks of 46-102 tasks (the
# short time budgets' cases)
for _name in ("ghostnet_100", "mixnet_s", "lcnet_100", "fbnetc_100", "semnasnet_075", "tinynet_a", "rexnet_100",
              "spnasnet_100", "efficientnet_lite0", "hardcorenas_a", "mnasnet_small", "fbnetv3_b", "efficientnet_es",
              "mobilenetv2_110d", "mixnet_m", "regnety_002", "dla34", "ese_vovnet19b_dw", "mobilenetv3_small_100",
              "mnasnet_050", "lcnet_075", "resnet18d", "ghostnetv2_100", "repvgg_a0", "resnet26d", "resnet34d",
              "resnet10t", "hrnet_w18_small", "dla46_c", "selecsls42b", "cspresnet50", "mobilenetv2_050",
              "res2net50_14w_8s", "dla46x_c", "mobileone_s1", "hrnet_w18_small_v2", "tinynet_b", "densenet121",
              "inception_v3", "ese_vovnet39b", "resnet14t", "regnetx_004", "hardcorenas_c", "ghostnet_050",
              "tf_mobilenetv3_large_075", "lcnet_050", "tinynet_c", "regnety_004", "hardcorenas_b", "lcnet_150",
              "tinynet_d", "dla60x_c"):
    network(_name, "small")(lambda _name=_name: _timm_small(_name))
network("squeezenet1_1", "small")(_squeezenet1_1)


@network("mobilenet_v3_large", "full")
def _mbv3_large():
    return _torchvision().models.mobilenet_v3_large(), _image(224)


@network("convnext_tiny", "full")
def _convnext_tiny():
    return _torchvision().models.convnext_tiny(), _image(224)


@network("regnet_y_800mf", "full")
def _regnet_y_800mf():
    return _torchvision().models.regnet_y_800mf(), _image(224)


@network("efficientnet_b0", "full")
def _efficientnet_b0():
    return _torchvision().models.efficientnet_b0(), _image(224)


@network("resnext50_32x4d", "full")
def _resnext50():
    return _torchvision().models.resnext50_32x4d(), _image(224)


@network("vit_b_16", "full")
def _vit_b_16():  # 197 tokens, as timm's ViT-S/16, at 768 features
    return _torchvision().models.vit_b_16(), _image(224)


@network("mobilenet_v3_small", "full")
def _mbv3_small():
    return _torchvision().models.mobilenet_v3_small(), _image(224)


@network("gernet_s", "full")
def _gernet_s():  # timm's GENet: ResNet-style basic and bottleneck blocks, then 1x1 / depthwise stages
    import timm

    return timm.create_model("gernet_s", pretrained=False), _image(224)


@network("vit_small", "full")
def _vit_small():
    import timm

    return timm.create_model("vit_small_patch16_224", pretrained=False), _image(224)


@network("distilbert", "full")
def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig()), _tokens(30522, 128)


@network("bert_base", "full")
def _bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig()), _tokens(30522, 128, token_types=True)


@network("gpt2", "full")
def _gpt2():
    from transformers import GPT2Config, GPT2Model

    return GPT2Model(GPT2Config(use_cache=False)), _tokens(50257, 128)


# ---- tiny fixtures -------------------------------------------------------------------------------
@network("tv_mobilenet_v3", "fixtures")
def _mbv3_tiny():  # SE blocks, hardswish, hardsigmoid
    return _torchvision().models.mobilenet_v3_small(width_mult=0.25, num_classes=10), _image(32)


@network("tv_convnext", "fixtures")
def _convnext_tiny_fixture():  # 7x7 depthwise, LayerNorm on the channels-last view, GELU
    tv = _torchvision()
    from torchvision.models.convnext import CNBlockConfig

    return tv.models.ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], num_classes=10), _image(32)


@network("tv_regnet", "fixtures")
def _regnet_tiny():  # grouped convolutions with SE
    tv = _torchvision()
    from torchvision.models.regnet import BlockParams

    params = BlockParams.from_init_params(depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=4, se_ratio=0.25)
    return tv.models.RegNet(params, stem_width=8, num_classes=10), _image(32)


@network("tv_efficientnet", "fixtures")
def _efficientnet_tiny():  # SiLU, SE, depthwise
    _torchvision()
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return EfficientNet(setting, 0.2, last_channel=last, num_classes=10), _image(32)


@network("tv_vit", "fixtures")
def _vit_tiny():
    _torchvision()
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(32, 8, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10), _image(32)


@network("hf_distilbert", "fixtures")
def _distilbert_tiny():
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, hidden_dim=64, max_position_embeddings=32)
    return DistilBertModel(cfg), _tokens(64, 16)


@network("hf_bert", "fixtures")
def _bert_tiny():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32)
    return BertModel(cfg), _tokens(64, 16, token_types=True)


@network("hf_gpt2", "fixtures")
def _gpt2_tiny():  # a decoder: causal mask, tanh GELU
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32, use_cache=False)
    return GPT2Model(cfg), _tokens(64, 16)


def _spread_weights(module) -> None:
    """Weights that keep a tiny network's activations near 1 (a library's initialization may
    leave a head at zero or let them fade: a check of zeros against zeros shows nothing)."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if not t.is_floating_point():
                continue
            if t.dim() >= 2:
                t.copy_(torch.randn(t.shape, generator=g) / max(1, t[0].numel()) ** 0.5)
            elif name.endswith("running_var") or name.endswith("weight"):
                t.copy_(0.5 + torch.rand(t.shape, generator=g))
            else:  # biases, running means
                t.copy_(0.1 * torch.randn(t.shape, generator=g))


def export(name: str, build: Callable, out_dir: str, embed: bool) -> dict:
    import onnx
    import torch

    torch.manual_seed(0)
    module, (args, names) = build()
    module.eval()
    if embed:
        _spread_weights(module)
    path = os.path.join(out_dir, f"{name}.onnx")
    args, kwargs = ((), args) if isinstance(args, dict) else (args, None)
    with torch.no_grad():  # the default exporter, its default opset
        torch.onnx.export(module, args, path, kwargs=kwargs, input_names=names)
    model = onnx.load(path)  # external weights (large models) come along
    if embed:  # one self-contained file a fixture
        for f in os.listdir(out_dir):
            if f.startswith(f"{name}.onnx") and f != f"{name}.onnx":
                os.remove(os.path.join(out_dir, f))
        onnx.save(model, path)
    ops = sorted({n.op_type for n in model.graph.node})
    return {"name": name, "file": os.path.basename(path), "opset": max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "inputs": {i.name: str(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
                       for i in model.graph.input},
            "ops": ops, "bytes": os.path.getsize(path), "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", choices=["full", "small", "fixtures"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--only", default=None, help="comma-separated names (default: the whole set)")
    p.add_argument("--size", type=int, default=96, help="the small set's input size (default 96)")
    args = p.parse_args(argv)
    SMALL_SIZE[0] = args.size
    chosen = NETWORKS[args.set]
    names = [n.strip() for n in args.only.split(",")] if args.only else list(chosen)
    unknown = [n for n in names if n not in chosen]
    if unknown:
        print(f"error: unknown network(s) {', '.join(unknown)}; the {args.set} set: {', '.join(chosen)}",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    manifest, failed = [], []
    for n in names:
        try:
            manifest.append(export(n, chosen[n], args.out, embed=args.set == "fixtures"))
        except Exception as e:  # noqa: BLE001 - one network's failure is reported, the others go on
            failed.append(n)
            print(f"{n}: export failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}", file=sys.stderr)
    for m in manifest:
        print(f"{m['name']}: opset {m['opset']}, {m['bytes'] / 1e6:.2f} MB, inputs {m['inputs']}, ops {' '.join(m['ops'])}")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
