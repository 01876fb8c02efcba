"""Models: ONNX files, zoo names, Relax modules, torch.export programs -> a Relax IRModule."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import tvm

from stormdrop.errors import SpecError


@dataclass
class Model:
    """A network to tune: a Relax module with its weights bound as constants."""

    name: str
    mod: tvm.IRModule
    inputs: dict[str, tuple[tuple[int, ...], str]]
    onnx_model: Any = None  # the ONNX ModelProto when there is one (ONNX Runtime runs the same network)
    torch_program: Any = None  # the torch.export program when there is one (PyTorch runs the same network)


def parse_input_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``["input:1x3x224x224", ...]`` -> ``{"input": (1, 3, 224, 224)}``."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items or []:
        name, sep, dims = item.rpartition(":")
        if not sep or not name or not re.fullmatch(r"\d+(x\d+)*", dims):
            raise SpecError(f"--input-shape: expected NAME:1x3x224x224, got {item!r}")
        out[name] = tuple(int(d) for d in dims.split("x"))
    return out


def load_model(spec: Any, *, input_shapes: dict[str, tuple[int, ...]] | None = None, batch: int = 1,
               resolution: int | None = None, seq_len: int | None = None, seed: int = 0) -> Model:
    """A model to tune or run (public as ``stormdrop.load_model``): ``spec`` is a zoo name, an
    ``.onnx`` path, a Relax ``IRModule`` or a ``torch.export`` program. A zoo model is built at
    ``batch`` and ``resolution`` (image models) or ``seq_len`` (sequence models) with random weights
    from ``seed``; an ONNX model's dynamic dimensions take ``input_shapes`` (input name -> shape) or
    ``batch``. A spec that names nothing loadable raises ``SpecError`` (one line)."""
    if isinstance(spec, tvm.IRModule):
        return Model("relax_module", spec, _relax_inputs(spec))
    if type(spec).__name__ == "ExportedProgram":
        from tvm.relax.frontend.torch import from_exported_program

        mod = from_exported_program(spec, keep_params_as_input=False)
        return Model("torch_export", mod, _relax_inputs(mod), torch_program=spec)
    if not isinstance(spec, str) or not spec:
        raise SpecError("--model: expected a zoo name or a path to an .onnx file")
    if spec.endswith(".onnx") or os.path.sep in spec or os.path.exists(spec):
        model = _read_onnx(spec)
        name = os.path.splitext(os.path.basename(spec))[0]
    else:
        from stormdrop.workloads.zoo import build_zoo_model

        kw: dict[str, Any] = {"batch": batch, "seed": seed}
        if resolution:
            kw["resolution"] = resolution
        if seq_len:
            kw["seq_len"] = seq_len
        model = build_zoo_model(spec, **kw)
        name = spec
    return from_onnx_model(model, name, input_shapes=input_shapes, batch=batch)


def _read_onnx(path: str) -> Any:
    import onnx

    if not os.path.isfile(path):
        raise SpecError(f"--model: no such file {path}")
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except Exception as err:  # noqa: BLE001 - protobuf raises several types
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise SpecError(f"--model: {path} is not a valid ONNX model ({first})") from None
    if not model.graph.node:
        raise SpecError(f"--model: {path} is not a valid ONNX model (empty graph)")
    return model


def from_onnx_model(model: Any, name: str, *, input_shapes: dict[str, tuple[int, ...]] | None = None,
                    batch: int = 1) -> Model:
    """Import an ONNX ModelProto with TVM's Relax importer (weights become constants)."""
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    from stormdrop.tvm_compat.relax_passes import clips_as_relax_ops

    supported = _get_convert_map()
    unsupported = sorted({n.op_type for n in model.graph.node if n.op_type not in supported})
    if unsupported:
        raise SpecError(f"--model: {name}: unsupported ONNX operator(s) {', '.join(unsupported)}")
    initializers = {i.name for i in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    overrides = dict(input_shapes or {})
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        tt = inp.type.tensor_type
        dims = []
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif k == 0:
                dims.append(batch)
            else:
                dims.append(-1)
        shape = overrides.pop(inp.name, tuple(dims))
        if any(x <= 0 for x in shape):
            raise SpecError(f"--model: input {inp.name!r} has unknown dimensions {tuple(dims)}; "
                            f"give them with --input-shape {inp.name}:1x3x224x224")
        shapes[inp.name] = tuple(shape)
        dtypes[inp.name] = _onnx_dtype(tt.elem_type)
    if overrides:
        raise SpecError(f"--input-shape: the model has no input {', '.join(overrides)} "
                        f"(inputs: {', '.join(shapes)})")
    with clips_as_relax_ops():  # ReLU6 as Relax ops, so that layouts propagate and it fuses
        try:
            mod = from_onnx(model, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False)
        except Exception as err:  # noqa: BLE001 - the importer raises many types
            first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]
            raise SpecError(f"--model: {name}: the ONNX importer failed: {first}") from None
    return Model(name, mod, {k: (shapes[k], dtypes[k]) for k in shapes}, onnx_model=model)


def _onnx_dtype(elem_type: int) -> str:
    import onnx

    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _relax_inputs(mod: tvm.IRModule) -> dict[str, tuple[tuple[int, ...], str]]:
    # TVM 0.27 Relax: a parameter's type is `Var.ty` (a TensorType) and its name `Var.name`;
    # the older `struct_info` / `name_hint` are gone.
    if "main" not in mod:
        raise SpecError("model: the Relax IRModule has no 'main' function")
    out = {}
    for param in mod["main"].params:
        name, ty = str(param.name), param.ty
        try:
            shape = tuple(int(x) for x in ty.shape.values)
        except Exception:  # noqa: BLE001
            raise SpecError(f"model input {name!r} has a dynamic shape; bind it first") from None
        out[name] = (shape, str(ty.dtype))
    return out
