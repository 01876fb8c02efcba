"""Where a tuned network loses to OpenVINO, layer by layer: OpenVINO's per-layer times (its
``PERF_COUNT`` profiler; fp32, latency hint, the given threads) of every convolution and matrix
product, grouped by shape, beside stormdrop's tasks of the same FLOPs and count, each timed
inside the compiled model (``per_task`` of a ``bench_models.py --json`` file).

    python benchmarks/layers_vs_openvino.py DIR/regnet_y_800mf.onnx --json results.json

Neither side's names tell which layer a task is, so the two are compared by FLOPs a call (within
2%): layers of equal FLOPs (a ResNet's bottleneck 1x1 convolutions) form one class. Times are
microseconds summed over the network's calls; the profiler's own overhead is in OpenVINO's, and
stormdrop's in-model timing is each kernel timed in place (``bench_models.py``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys


def _layer_shapes(model) -> dict[str, tuple[str, int]]:
    """ONNX node name -> (a description of its shapes, its FLOPs) for Conv / MatMul / Gemm."""
    import numpy as np
    from onnx import shape_inference

    model = shape_inference.infer_shapes(model)
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    dims.update({i.name: list(i.dims) for i in model.graph.initializer})
    out = {}
    for n in model.graph.node:
        if n.op_type not in ("Conv", "MatMul", "Gemm") or n.output[0] not in dims:
            continue
        x, w, y = dims.get(n.input[0], []), dims.get(n.input[1], []), dims[n.output[0]]
        if n.op_type == "Conv":
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            flops = 2 * int(np.prod(y)) * int(np.prod(w[1:]))
            desc = f"conv {x[1]}->{y[1]} k{w[2]}x{w[3]} g{group} out {y[2]}x{y[3]}"
        else:
            k = x[-1] if x else 0
            flops = 2 * int(np.prod(y)) * k
            desc = f"{n.op_type.lower()} {'x'.join(map(str, x))} @ {'x'.join(map(str, w))}"
        out[n.name] = (desc, flops)
    return out


def openvino_layers(path: str, threads: int, runs: int = 50) -> tuple[dict, float]:
    """(shape description, FLOPs a call) -> [us summed over calls, calls], and OpenVINO's other
    layers' us: mean per inference over ``runs`` profiled runs."""
    import numpy as np
    import onnx
    import openvino as ov

    shapes = _layer_shapes(onnx.load(path))
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
        "PERF_COUNT": "YES"})
    request = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    inputs = {i.any_name: rng.random([d.get_length() for d in i.get_partial_shape()]).astype(np.float32)
              for i in compiled.inputs}
    for _ in range(10):
        request.infer(inputs)
    per_node: dict[str, float] = collections.defaultdict(float)
    for _ in range(runs):
        request.infer(inputs)
        for p in request.get_profiling_info():
            per_node[p.node_name] += p.real_time.total_seconds() * 1e6 / runs
    groups: dict[tuple[str, int], list] = collections.defaultdict(lambda: [0.0, 0])
    other = 0.0
    for name, us in per_node.items():
        if name in shapes:
            groups[shapes[name]][0] += us
            groups[shapes[name]][1] += 1
        else:
            other += us
    return dict(groups), other


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("network", help="an .onnx file")
    p.add_argument("--json", help="a bench_models.py --json file with this network's stormdrop per_task")
    p.add_argument("--threads", type=int, default=0, help="OpenVINO's threads (default: physical cores)")
    args = p.parse_args(argv)
    from stormdrop.target import physical_cores

    groups, other = openvino_layers(args.network, args.threads or physical_cores())
    tasks = []
    if args.json:
        doc = json.load(open(args.json))
        model = next((m for m in doc["models"] if m["model"].endswith(args.network.split("/")[-1])), None)
        if model is None:
            print(f"{args.json} has no model {args.network}", file=sys.stderr)
            return 2
        tasks = [t for t in model["stormdrop"]["per_task"] if t.get("in_model_s")]
    print(f"OpenVINO: {sum(us for us, _ in groups.values()):.0f} us in convolutions and matrix products, {other:.0f} us "
          "in its other layers (a profiled inference)")
    print("| layer (OpenVINO) | calls | GFLOP a call | OpenVINO us |")
    print("| --- | --- | --- | --- |")
    for (desc, flops), (us, calls) in sorted(groups.items(), key=lambda g: -g[1][0]):
        print(f"| {desc} | {calls} | {flops / 1e9:.4f} | {us:.0f} |")
    if not tasks:
        return 0
    # layers of equal FLOPs are told apart by neither side's names: compared by FLOPs a call
    classes: dict[int, dict] = {}
    for (desc, flops), (us, calls) in groups.items():
        key = next((k for k in classes if abs(k - flops) <= 0.02 * flops), flops)
        c = classes.setdefault(key, {"ov": 0.0, "calls": 0, "ours": 0.0, "tasks": [], "layers": []})
        c["ov"] += us
        c["calls"] += calls
        c["layers"].append(desc)
    rest = []
    for t in tasks:
        key = next((k for k in classes if abs(k - t["flops"]) <= 0.02 * k), None)
        if key is None:
            rest.append(t)
            continue
        classes[key]["ours"] += t["in_model_s"] * 1e6
        classes[key]["tasks"].append(f"{t['name']} x{t['weight']}")
    print()
    print("| GFLOP a call | OpenVINO calls | OpenVINO us | stormdrop us | OpenVINO / stormdrop | OpenVINO layers | stormdrop tasks |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for flops, c in sorted(classes.items(), key=lambda kc: -max(kc[1]["ov"], kc[1]["ours"])):
        ratio = f"{c['ov'] / c['ours']:.2f}" if c["ours"] else "-"
        print(f"| {flops / 1e9:.4f} | {c['calls']} | {c['ov']:.0f} | {c['ours']:.0f} | {ratio} | {'; '.join(c['layers'])} "
              f"| {', '.join(c['tasks']) or '-'} |")
    if rest:
        print(f"stormdrop tasks of no OpenVINO layer's FLOPs: {sum(t['in_model_s'] for t in rest) * 1e6:.0f} us: "
              + ", ".join(f"{t['name']} {t['in_model_s'] * 1e6:.0f}" for t in sorted(rest, key=lambda t: -t["in_model_s"])[:12]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
