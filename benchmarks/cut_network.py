"""Cut an ONNX network after one of its tensors: its inputs up to that tensor, as a network of its own.

A transformer's layers are alike, so its first block has the model's kernels (tasks) at a
twelfth of its tuning time; the padded-attention A/B of RESULTS ("Padded attention") ran on

    python benchmarks/export_networks.py --set full --out DIR
    python benchmarks/cut_network.py DIR/vit_small.onnx vit_block.onnx --output add_2

(``add_2``: timm ViT-S/16's first block's output, as PyTorch's exporter names it).
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("network", help="an .onnx file (its external data beside it)")
    p.add_argument("out", help="the .onnx file to write (weights embedded)")
    p.add_argument("--output", required=True, help="the tensor to end at")
    args = p.parse_args(argv)
    import onnx
    import onnx.utils

    model = onnx.load(args.network)
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    cut = onnx.utils.Extractor(model).extract_model(inputs, [args.output])
    onnx.checker.check_model(cut)
    onnx.save(cut, args.out)
    print(f"{args.out}: {len(cut.graph.node)} nodes, inputs {inputs}, output {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
