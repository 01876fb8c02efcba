"""Targets (a public module): host detection (LLVM CPU name, physical cores), parsing, canonical form.

A CPU target without ``mcpu`` gives kernels several times slower on x86 (no AVX
code generation), and MetaSchedule refuses a target without ``num-cores``, so the
default target is always the host with both filled in.
"""

from __future__ import annotations

import json
import os

import tvm
from tvm.target import Target

from stormdrop.errors import SpecError


def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads not counted)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        available = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    try:
        phys = core = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    phys = value
                elif key == "core id":
                    core = value
                elif not key and core:
                    cores.add((phys, core))
                    phys = core = ""
        if core:
            cores.add((phys, core))
    except OSError:  # pragma: no cover
        pass
    return max(1, min(available, len(cores) or available))


def num_cores(target: Target) -> int:
    """The cores a target's kernels run on: an LLVM target's ``num-cores`` (0 where it names none),
    else this machine's physical cores."""
    return int(target.attrs.get("num-cores", 0)) if target.kind.name == "llvm" else physical_cores()


def host_target(num_cores: int | None = None) -> Target:
    """The host CPU as an LLVM target with its real ``mcpu`` and physical core count."""
    import tvm.target.codegen as cg

    return Target(
        {
            "kind": "llvm",
            "mcpu": cg.llvm_get_system_cpu(),
            "num-cores": int(num_cores or physical_cores()),
        }
    )


CUDA_DEFAULTS = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 49152, "thread_warp_size": 32,
                 "max_num_threads": 1024}


def _cuda_arch() -> str | None:
    try:
        dev = tvm.cuda(0)
        if dev.exist:
            return "sm_" + dev.compute_version.replace(".", "")
    except Exception:  # noqa: BLE001 - no CUDA runtime in this build/machine
        return None
    return None


def parse_target(text: str | dict | Target | None) -> Target:
    """Parse ``--target``: None (host), a JSON dict, a tag, ``llvm`` or ``cuda``.

    Missing ``mcpu``/``num-cores`` on a host LLVM target are filled in from the
    host; ``cuda`` without ``arch`` takes the visible GPU's compute capability.
    """
    if text is None or text == "":
        return host_target()
    if isinstance(text, Target):
        return text
    try:
        if isinstance(text, dict):
            config = dict(text)
        elif text.lstrip().startswith("{"):
            config = json.loads(text)
        elif text in ("llvm", "cpu"):
            config = {"kind": "llvm"}
        elif text in ("cuda", "gpu", "nvidia"):
            config = {"kind": "cuda"}
        else:
            config = json.loads(str(Target(text)))
    except json.JSONDecodeError as err:
        raise SpecError(f"--target: invalid JSON ({err.msg} at column {err.colno})") from None
    except Exception as err:  # noqa: BLE001 - TVM raises several types for bad tags
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SpecError(f"--target: cannot parse {text!r}: {first}") from None
    if not isinstance(config, dict) or "kind" not in config:
        raise SpecError('--target: expected a TVM target such as {"kind": "llvm"} or "cuda"')
    kind = config["kind"]
    if kind == "llvm":
        host = host_target()
        if "mtriple" not in config or config.get("mtriple") == host.attrs.get("mtriple"):
            config.setdefault("mcpu", str(host.attrs["mcpu"]))
        config.setdefault("num-cores", int(host.attrs["num-cores"]))
    elif kind == "cuda":
        if "arch" not in config:
            arch = _cuda_arch()
            if arch is None:
                raise SpecError(
                    '--target: no GPU visible to detect the CUDA arch; give it, e.g. {"kind": "cuda", "arch": "sm_90a"}'
                )
            config["arch"] = arch
        # MetaSchedule's CUDA rules need these and TVM 0.27 leaves them unset on a plain
        # {"kind": "cuda"}: every NVIDIA GPU since Kepler has these limits (the tags agree)
        for attr, value in CUDA_DEFAULTS.items():
            config.setdefault(attr, value)
        config.setdefault("host", host_target().export())
    try:
        host_cfg = config.pop("host", None)
        return Target(config, host=host_cfg) if host_cfg else Target(config)
    except Exception as err:  # noqa: BLE001
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SpecError(f"--target: {first}") from None


def vector_lanes(target: Target) -> int | None:
    """fp32 lanes of the target's widest vector unit (x86 LLVM targets: 16 with AVX-512,
    8 with AVX2), else ``None``."""
    if target.kind.name != "llvm":
        return None
    from tvm.target import codegen

    try:
        features = set(codegen.llvm_get_cpu_features(target))
    except Exception:  # noqa: BLE001 - a target LLVM cannot describe
        return None
    if "avx512f" in features:
        return 16
    if "avx2" in features or "avx" in features:
        return 8
    return None


def canonical(target: Target) -> str:
    """Canonical JSON text of a target: the key under which records are stored."""
    return json.dumps(json.loads(str(target)), sort_keys=True)


def from_canonical(text: str) -> Target:
    """The Target of a canonical JSON text (inverse of ``canonical``)."""
    config = json.loads(text)
    host = config.pop("host", None)
    return Target(config, host=host) if host else Target(config)


def device_type(target: Target) -> str:
    """The runtime device name of a target: ``cpu`` or ``cuda``."""
    return "cuda" if target.kind.name == "cuda" else "cpu"


def describe(target: Target) -> str:
    """A short human form: ``KIND MCPU xCORES`` (``llvm <mcpu> x2``)."""
    attrs = target.attrs
    if target.kind.name == "llvm":
        return f"llvm {attrs.get('mcpu', '?')} x{attrs.get('num-cores', '?')}"
    return f"{target.kind.name} {attrs.get('arch', '')}".strip()
