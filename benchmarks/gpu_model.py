"""A whole network tuned on an NVIDIA GPU, against PyTorch on the same GPU.

torchvision's network (random weights, seed 0) is exported to ONNX by PyTorch's default
exporter (``export_networks.export``), tuned by ``stormdrop tune --model FILE --target cuda``
for ``--budget`` seconds (its own check: the tuned outputs against ONNX Runtime's on the CPU),
and timed beside PyTorch on the same GPU, batch 1, fp32:

- PyTorch eager with ``cudnn.benchmark`` on and TF32 off (fp32 arithmetic, as TVM's kernels);
- ``torch.compile`` (inductor, default mode), the same settings, when it compiles within
  ``--compile-s`` seconds.

Every latency is the median of 5 means of >= 100 ms of back-to-back runs (stormdrop's model
timer, ``stormdrop.model.run``, on the Relax VM; PyTorch's synchronized at each mean's end).
With ``--hub ab`` the network is tuned twice, with the shipped schedule hub and without (each tune
times its own model; a GPU's timings are steadier than a shared CPU's). Writes ``OUT/gpu_model.json``
and prints one table row an arm. Needs ``torch``, ``torchvision`` and
``onnxscript`` beside stormdrop (the lent GPU machine has them; ``benchmarks/device_cuda.sh``
runs this with MODEL=...). ``--device cpu --target llvm`` rehearses every step on a CPU host.

    python benchmarks/gpu_model.py --network resnet18 --budget 240 --out /tmp/out
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import export_networks  # noqa: E402 - the benchmark folder's exporter

NETWORKS = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0")


def build(name: str, resolution: int):
    import torch

    torchvision = export_networks._torchvision()
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None), ((torch.randn(1, 3, resolution, resolution),), ["input"])


def median_of_means(run, sync, repeats: int = 5, min_s: float = 0.1) -> float:
    """Seconds a run: the median of ``repeats`` means of >= ``min_s`` of back-to-back runs."""
    for _ in range(3):
        run()
    sync()
    means = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            run()
            n += 1
            if n % 8 == 0:
                sync()
                if time.perf_counter() - t0 >= min_s:
                    break
        means.append((time.perf_counter() - t0) / n)
    return statistics.median(means)


def pytorch_session(name: str, resolution: int, device: str):
    """The network on ``device`` in eval mode, its input, a synchronizer and the facts to report."""
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    module, ((x,), _) = build(name, resolution)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    facts = {"torch": torch.__version__, "device": device, "tf32": False, "cudnn_benchmark": True}
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(0)
    return module.eval().to(device), x.to(device), sync, facts


def eager_latency(module, x, sync) -> float:
    import torch

    with torch.no_grad():
        return median_of_means(lambda: module(x), sync)


def compiled_latency(module, x, sync, limit_s: float) -> dict:
    """``torch.compile``'s latency, None when compiling took over ``limit_s`` or failed."""
    import torch

    out = {"compile_s": None}
    try:
        with torch.no_grad():
            t0 = time.monotonic()
            compiled = torch.compile(module)
            compiled(x)
            sync()
            out["compile_seconds"] = round(time.monotonic() - t0, 1)
            if out["compile_seconds"] <= limit_s:
                out["compile_s"] = median_of_means(lambda: compiled(x), sync)
    except Exception as e:  # noqa: BLE001 - reported, the eager figure stands
        out["compile_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
    return out


def tune_arm(args: argparse.Namespace, manifest: dict, arm: str) -> dict:
    """``stormdrop tune`` of the exported network in a process of its own (the shipped schedule hub on,
    or off: ``arm``), with its files under OUT named by the arm; the row of its figures."""
    off = arm == "no hub"
    tag = "_nohub" if off else ""
    tuned_json = os.path.join(args.out, f"model{tag}.json")
    cmd = [args.stormdrop_python, "-m", "stormdrop.cli.main", "-vv", "tune", "--model",
           os.path.join(args.out, manifest["file"]), "--target", args.target, "--time-budget", str(args.budget),
           "--db", os.path.join(args.out, f"model{tag}.db"), "--json", tuned_json, "--no-progress"]
    env = dict(os.environ, **({"STORMDROP_HUB": "off"} if off else {}))
    t1 = time.monotonic()
    with open(os.path.join(args.out, f"model{tag}.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.monotonic() - t1
    print(f"stormdrop tune ({arm}) exit {rc} after {wall:.0f} s", flush=True)
    tuned = json.load(open(tuned_json)) if rc == 0 else {}
    latency = tuned.get("latency_s", {})
    return {"network": args.network, "resolution": args.resolution, "batch": 1, "budget_s": args.budget, "hub": arm,
            "command": ("STORMDROP_HUB=off " if off else "") + " ".join(cmd[1:]), "stormdrop_exit": rc,
            "stormdrop_wall_s": round(wall, 1), "target": tuned.get("target"), "tuning_s": tuned.get("tuning_s"),
            "stormdrop_s": latency.get("tuned"), "onnxruntime_cpu_s": latency.get("onnxruntime"),
            "tasks": len(tuned.get("tasks", [])),
            "trials": sum(sum(t.get("trials", {}).values()) for t in tuned.get("tasks", [])),
            "faster_after_s": tuned.get("faster_after_s"), "export": manifest}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--network", default="resnet18", choices=NETWORKS)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--budget", type=float, default=240, help="stormdrop's tuning time (s)")
    p.add_argument("--compile-s", type=float, default=120, help="torch.compile's time limit (s)")
    p.add_argument("--target", default="cuda")
    p.add_argument("--device", default="cuda", help="PyTorch's device (cpu: a rehearsal)")
    p.add_argument("--hub", default="on", choices=["on", "off", "ab"],
                   help="the shipped schedule hub (cuda-sm_90 holds resnet18 at 224): on, off, or one tune each (ab)")
    p.add_argument("--stormdrop-python", default=sys.executable)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    manifest = export_networks.export(args.network, lambda: build(args.network, args.resolution), args.out,
                                      embed=False)
    print(f"exported {manifest['file']} (opset {manifest['opset']}) in {time.monotonic() - t0:.0f} s", flush=True)
    module, x, sync, facts = pytorch_session(args.network, args.resolution, args.device)
    peers = {**facts, "eager_s": eager_latency(module, x, sync), "compile_s": None}
    print(f"PyTorch eager: {peers['eager_s'] * 1e3:.3f} ms", flush=True)
    rows = []
    for arm in (("hub", "no hub") if args.hub == "ab" else ("hub" if args.hub == "on" else "no hub",)):
        rows.append(tune_arm(args, manifest, arm))
        rows[-1]["pytorch"] = peers
    path = os.path.join(args.out, "gpu_model.json")
    for final in (False, True):  # written before torch.compile too: a run cut there keeps the rest
        if final:
            peers.update(compiled_latency(module, x, sync, args.compile_s))
        with open(path, "w") as f:
            json.dump(rows[0] if len(rows) == 1 else {"arms": rows}, f, indent=1)

    def ms(s):
        return "-" if s is None else f"{s * 1e3:.3f}"

    print("| network | hub | stormdrop ms | tuning s | trials | PyTorch eager ms | torch.compile ms | eager / stormdrop |")
    for row in rows:
        ratio = f"{peers['eager_s'] / row['stormdrop_s']:.2f}" if row["stormdrop_s"] else "-"
        print(f"| {args.network} {args.resolution} | {row['hub']} | {ms(row['stormdrop_s'])} | {row['tuning_s']} | "
              f"{row['trials']} | {ms(peers['eager_s'])} | {ms(peers['compile_s'])} | {ratio} |")
    rc = max(row["stormdrop_exit"] for row in rows)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
