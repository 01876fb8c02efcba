"""Kernels from user files: TE functions, PrimFuncs, IRModules, and their errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from test_workloads import _assert_spec_error

from stormdrop.errors import SpecError
from stormdrop.workloads import Kernel, kernel_args, parse_kernel

USER_FILE = """
import tvm
from tvm import te
from tvm.script import tirx as T

def add_te():
    A = te.placeholder((8, 16), name="A")
    B = te.placeholder((8, 16), name="B")
    C = te.compute((8, 16), lambda i, j: A[i, j] * B[i, j] + A[i, j], name="C")
    return [A, B, C]

def scale_prim():
    A = te.placeholder((32,), name="A")
    B = te.compute((32,), lambda i: A[i] * 3.0, name="B")
    return te.create_prim_func([A, B]).with_attr("global_symbol", "scale")

def module_one():
    return tvm.IRModule({"other": scale_prim()})

def raises():
    raise ValueError("bad shape\\nsecond line")

def wrong_type():
    return 42

def empty_list():
    return []

def symbolic():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    return [A, te.compute((n,), lambda i: A[i] + 1.0, name="B")]

NOT_A_FUNCTION = 3
"""


@pytest.fixture()
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_kernels.py"
    path.write_text(textwrap.dedent(USER_FILE))
    return path


def _run(k: Kernel, inputs: list[np.ndarray]) -> np.ndarray:
    args = kernel_args(k.mod)
    dev = tvm.cpu()
    out = tvm.runtime.empty(args[-1][1], args[-1][2], dev)
    tvm.compile(k.mod, target={"kind": "llvm"})["main"](
        *[tvm.runtime.tensor(x, dev) for x in inputs], out
    )
    return out.numpy()


def test_user_te_function(user_file: Path):
    spec = f"{user_file}:add_te"
    k = parse_kernel(spec)
    assert (k.name, k.op_class, k.spec) == ("add_te", "user:add_te", spec)
    assert [s for _, s, _ in kernel_args(k.mod)] == [(8, 16)] * 3
    assert k.flops == 2 * 8 * 16
    a, b = np.random.default_rng(1).standard_normal((2, 8, 16)).astype("float32")
    np.testing.assert_allclose(_run(k, [a, b]), a * b + a, rtol=1e-6)


@pytest.mark.parametrize("func", ["scale_prim", "module_one"])
def test_user_primfunc_and_module(user_file: Path, func: str):
    k = parse_kernel(f" {user_file} : {func} ")
    assert k.name == func and k.op_class == f"user:{func}" and k.flops == 32
    assert list(k.mod.get_global_vars())[0].name_hint == "main"
    assert k.mod["main"].attrs["global_symbol"] == "main"
    a = np.arange(32, dtype="float32")
    np.testing.assert_allclose(_run(k, [a]), 3 * a)


def test_user_existing_file_without_py_suffix(tmp_path: Path):
    path = tmp_path / "kernels_noext"
    path.write_text(textwrap.dedent(USER_FILE))
    k = parse_kernel(f"{path}:add_te")
    assert k.op_class == "user:add_te"


USER_ERRORS = [
    ("missing.py:add_te", ["user file not found", "missing.py"]),
    ("{path}:nope", ["has no function 'nope'", "add_te", "scale_prim"]),
    ("{path}:NOT_A_FUNCTION", ["has no function 'NOT_A_FUNCTION'"]),
    ("{path}:raises", ["raised ValueError: bad shape second line"]),
    ("{path}:wrong_type", ["returned int", "PrimFunc", "te.Tensor"]),
    ("{path}:empty_list", ["returned list", "PrimFunc"]),
    ("{path}:symbolic", ["symbolic shape", "static"]),
    ("{path}:", ["bad function name"]),
]


@pytest.mark.parametrize("spec,fragments", USER_ERRORS, ids=[c[0] for c in USER_ERRORS])
def test_user_errors(user_file: Path, tmp_path: Path, spec: str, fragments: list[str]):
    spec = spec.format(path=user_file).replace("missing.py", str(tmp_path / "missing.py"))
    _assert_spec_error(spec, fragments)


def test_user_file_import_error(tmp_path: Path):
    path = tmp_path / "broken.py"
    path.write_text("import no_such_module_xyz\n")
    with pytest.raises(SpecError, match="error while importing user file .*ModuleNotFoundError"):
        parse_kernel(f"{path}:f")


