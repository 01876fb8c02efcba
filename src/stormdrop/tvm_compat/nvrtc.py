"""CUDA sources compiled to cubins on the host, with NVRTC: a rough edge of TVM 0.27 worked around.

``tvm.build`` for CUDA stores the kernels' CUDA *source* (format ``cuda``); it is compiled
only when a GPU's runtime loads the library. A CPU-only host never learnt whether a candidate
compiles at all, and the tests' "device code" was source. TVM's NVRTC path
(``tvm.support.nvcc.compile_cuda``) also finds headers only in a toolkit's layout (CUDA_PATH,
or nvcc's folder, where it does not see through a wrapper script such as /usr/local/bin/nvcc
here), not in NVIDIA's pip packages (``nvidia/cu13/include`` and its ``cccl``); and NVRTC 12
fails on CUDA 13's headers. ``cuda_cubin`` compiles a source to a cubin with the `cuda`
extra's NVRTC and headers (same version), or a toolkit's; the builder checks every CUDA
candidate with it (a source that does not compile is a build error, on the host).

Where TVM's CUDA runtime is present (a GPU's host), ``tvm.build`` itself compiles each CUDA
source, through the ``tvm_callback_cuda_compile`` function TVM registers, and the check would
compile it a second time. Within ``compiling(arch)`` that call is answered by ``cuda_cubin`` and
its cubin kept for the check (``library_cubins``), so a candidate is compiled once either way.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import shutil
from collections.abc import Iterator

CUDA_EM_MACHINE = 190  # ELF e_machine of NVIDIA's cubins


_NVRTC_PROBE = ('#include <cuda/std/cstdint>\n#include <cuda_fp16.h>\n#include <mma.h>\n'
                 'extern "C" __global__ void probe(half* x) { x[0] = __float2half(1.0f); }\n')


def _cuda_roots() -> list[str]:
    """Folders that may hold include/cuda_runtime.h: the `cuda` extra's pip packages (nvidia/cu13,
    versions pinned with its NVRTC) first, then CUDA_PATH, /usr/local/cuda and nvcc's toolkit."""
    roots = []
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        roots += sorted(os.path.join(base, n) for n in os.listdir(base) if re.fullmatch(r"cu\d+|cuda_runtime", n))
    nvcc_bin = shutil.which("nvcc")
    roots += [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda",
              os.path.dirname(os.path.dirname(nvcc_bin)) if nvcc_bin else ""]
    return list(dict.fromkeys(r for r in roots if r and os.path.isfile(os.path.join(r, "include", "cuda_runtime.h"))))


@functools.cache
def cuda_headers() -> tuple[str, tuple[str, ...]]:
    """(CUDA root, extra include folders) with which this process's NVRTC compiles a kernel that
    includes what TVM's CUDA code includes (cuda/std, cuda_fp16.h, and mma.h for tensor cores): the first of ``_cuda_roots``
    that does. A machine's headers may not suit its NVRTC (CUDA 13 headers need 13's NVRTC and the
    cccl folder; a torch install may bring runtime headers without cccl), so each is tried once.
    RuntimeError, with every root's reason, when none compiles."""
    tried = []
    for root in _cuda_roots():
        includes = tuple(p for p in (os.path.join(root, "include", "cccl"),) if os.path.isdir(p))
        try:
            _nvrtc_cubin(_NVRTC_PROBE, "sm_80", root, includes)
            return root, includes
        except Exception as err:  # noqa: BLE001 - NVRTC's errors are RuntimeErrors, a broken install anything
            tried.append(f"{root}: {str(err).strip()[-300:]}")
    raise RuntimeError("no CUDA headers NVRTC compiles with (pip install 'stormdrop[cuda]', or set CUDA_PATH "
                       "to a toolkit)" + (": " + " | ".join(tried) if tried else ""))


def ready() -> bool:
    """Whether NVRTC's Python bindings (the `cuda` extra) and CUDA headers it compiles with are here."""
    try:
        import cuda.bindings.nvrtc  # noqa: F401

        cuda_headers()
    except (ImportError, RuntimeError):
        return False
    return True


def _nvrtc_cubin(source: str, arch: str, root: str, includes: tuple[str, ...]) -> bytes:
    from tvm.support import nvcc

    before = os.environ.get("CUDA_PATH")
    os.environ["CUDA_PATH"] = root  # where compile_cuda looks for include/ (see the module's notes)
    try:
        return bytes(nvcc.compile_cuda(source, target_format="cubin", arch=arch, compiler="nvrtc",
                                       options=[f"-I{p}" for p in includes]))
    finally:
        if before is None:
            del os.environ["CUDA_PATH"]
        else:
            os.environ["CUDA_PATH"] = before


def cuda_cubin(source: str, arch: str) -> bytes:
    """``source`` (a CUDA module's, from ``tvm.build``) compiled by NVRTC to a cubin for ``arch``."""
    return _nvrtc_cubin(source, arch, *cuda_headers())


def cubin_sm(cubin: bytes) -> int:
    """The SM version a cubin's machine code is for (ELF e_flags), e.g. 90; ValueError if not a cubin."""
    import struct

    if cubin[:4] != b"\x7fELF" or struct.unpack_from("<H", cubin, 18)[0] != CUDA_EM_MACHINE:
        raise ValueError("not a CUDA cubin")
    flags = struct.unpack_from("<I", cubin, 48)[0]
    # CUDA 13's cubins keep the SM in bits 8-15 (e.g. 0x6005a04 for sm_90); older ones in bits 0-7
    return (flags >> 8) & 0xFF if flags >> 24 else flags & 0xFF


def source_digest(source: str | bytes) -> str:
    """The key of a CUDA source among compiled cubins."""
    return hashlib.sha256(source.encode() if isinstance(source, str) else bytes(source)).hexdigest()


def library_cubins(lib: object, arch: str) -> dict[str, bytes]:
    """Each CUDA module's source in the built library ``lib`` compiled to a cubin for ``arch``,
    by source digest: the cubin ``tvm.build`` already had made of it within ``compiling``, else
    compiled now (a source that does not compile raises NVRTC's error)."""
    cubins = {}
    for m in lib.imports:  # type: ignore[attr-defined]
        if m.kind == "cuda":
            source = m.inspect_source()
            key = source_digest(source)
            cubins[key] = _COMPILED.pop(key, None) or cuda_cubin(source, arch)
    return cubins


_COMPILED: dict[str, bytes] = {}  # what _compile made within ``compiling``, by source digest
_ARCH: list[str] = []  # the arch ``compiling`` compiles for, while it is open
_TVM_CALLBACK = "tvm_callback_cuda_compile"
_PREVIOUS: list = []  # TVM's own function, once ``_install`` has put ``_compile`` in its place


def _compile(code: object, *rest: object) -> bytes:
    """``tvm_callback_cuda_compile``: within ``compiling``, ``cuda_cubin`` (kept for
    ``library_cubins``); else TVM's own function."""
    if _ARCH:
        source = code.decode() if isinstance(code, bytes) else str(code)
        cubin = cuda_cubin(source, _ARCH[0])
        _COMPILED[source_digest(source)] = cubin
        return cubin
    if not _PREVIOUS or _PREVIOUS[0] is None:
        raise RuntimeError("no CUDA compiler is registered with TVM")
    return _PREVIOUS[0](code, *rest)


def _install() -> None:
    """Put ``_compile`` in front of TVM's ``tvm_callback_cuda_compile`` (once a process)."""
    if _PREVIOUS:
        return
    import tvm.support.nvcc  # noqa: F401 - registers TVM's own function, which _compile falls back on
    import tvm_ffi

    _PREVIOUS.append(tvm_ffi.get_global_func(_TVM_CALLBACK, allow_missing=True))
    tvm_ffi.register_global_func(_TVM_CALLBACK, _compile, override=True)


@contextlib.contextmanager
def compiling(arch: str) -> Iterator[None]:
    """Within the block, a CUDA source TVM compiles (``tvm.build`` on a host with TVM's CUDA
    runtime) is compiled by ``cuda_cubin`` for ``arch`` and its cubin kept for ``library_cubins``
    of the library built; cubins ``library_cubins`` did not take are dropped at the end."""
    _install()
    _ARCH.append(arch)
    try:
        yield
    finally:
        _ARCH.clear()
        _COMPILED.clear()
