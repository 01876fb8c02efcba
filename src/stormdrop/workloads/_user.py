"""Loading user-defined kernels: ``path/to/file.py:function_name``."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from types import ModuleType
from typing import Any

import tvm
from tvm import te
from tvm.tirx import PrimFunc

from stormdrop.errors import SpecError


def is_user_spec(spec: str) -> bool:
    """Whether ``spec`` names a user file (``x.py:func``, or an existing file before the last ``:``)."""
    head = spec.strip().rpartition(":")[0].strip() if ":" in spec else spec.strip()
    return head.endswith(".py") or (bool(head) and os.path.isfile(os.path.expanduser(head)))


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, whitespace collapsed to one line, bounded length."""
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _import_file(path: str) -> ModuleType:
    """Import ``path`` under a module name unique to its absolute path (re-executed each call)."""
    real = os.path.realpath(path)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(real))[0])
    digest = hashlib.sha1(real.encode()).hexdigest()[:12]
    name = f"stormdrop_user_{stem}_{digest}"
    loader = importlib.machinery.SourceFileLoader(name, real)  # any file name, not only *.py
    spec = importlib.util.spec_from_file_location(name, real, loader=loader)
    if spec is None:  # pragma: no cover
        raise SpecError(f"cannot import user file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise SpecError(f"error while importing user file {path}: {_one_line(exc)}") from exc
    return module


def _as_primfunc(result: Any, where: str) -> PrimFunc:
    """Normalize what a user function returned into one PrimFunc."""
    if isinstance(result, PrimFunc):
        return result
    if isinstance(result, tvm.IRModule):
        funcs = {gv.name_hint: f for gv, f in result.functions.items()}
        if isinstance(funcs.get("main"), PrimFunc):
            return funcs["main"]
        prims = [f for f in funcs.values() if isinstance(f, PrimFunc)]
        if len(prims) == 1:
            return prims[0]
        raise SpecError(
            f"{where} returned an IRModule with {len(prims)} PrimFuncs and no 'main' PrimFunc:"
            " expected a 'main' PrimFunc or exactly one PrimFunc"
        )
    if (
        isinstance(result, (list, tuple))
        and result
        and all(isinstance(t, te.Tensor) for t in result)
    ):
        try:
            return te.create_prim_func(list(result))
        except Exception as exc:
            raise SpecError(f"{where}: te.create_prim_func failed: {_one_line(exc)}") from exc
    raise SpecError(
        f"{where} returned {type(result).__name__}: expected a tvm.tirx.PrimFunc, an IRModule"
        " or a list of te.Tensor (inputs then outputs)"
    )


def _check_static(func: PrimFunc, where: str) -> None:
    """Reject parameters that are not buffers of static shape (they cannot be tuned)."""
    for param in func.params:
        shape = getattr(param, "shape", None)
        if shape is None:
            raise SpecError(
                f"{where}: parameter {param} is not a buffer: expected buffer arguments only"
            )
        if not all(isinstance(d, (int, tvm.tirx.IntImm)) for d in shape):
            raise SpecError(
                f"{where}: buffer {param.name} has a symbolic shape: expected static shapes"
            )


def load_user_function(spec: str) -> tuple[tvm.IRModule, str]:
    """Load ``path.py:function`` and return ``(IRModule({"main": func}), function_name)``."""
    text = spec.strip()
    if ":" not in text:
        raise SpecError(
            f"user file spec '{text}' names no function: expected path/to/file.py:function_name"
        )
    path, _, func_name = text.rpartition(":")
    path, func_name = os.path.expanduser(path.strip()), func_name.strip()
    if not func_name.isidentifier():
        raise SpecError(
            f"bad function name '{func_name}' in '{text}': expected path/to/file.py:function_name"
        )
    if not os.path.isfile(path):
        raise SpecError(f"user file not found: {path}")
    module = _import_file(path)
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        names = sorted(
            n
            for n, obj in vars(module).items()
            if callable(obj)
            and not n.startswith("_")
            and getattr(obj, "__module__", None) == module.__name__
        )
        found = ", ".join(names) if names else "none"
        raise SpecError(
            f"user file {path} has no function '{func_name}' (functions defined: {found})"
        )
    where = f"user function {func_name} in {path}"
    try:
        result = func()
    except (Exception, SystemExit) as exc:
        raise SpecError(f"{where} raised {_one_line(exc)}") from exc
    prim = _as_primfunc(result, where)
    _check_static(prim, where)
    prim = prim.with_attr("global_symbol", "main")
    return tvm.IRModule({"main": prim}), func_name
