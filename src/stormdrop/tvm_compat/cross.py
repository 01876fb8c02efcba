"""Libraries for another CPU than this one (an ARM board behind an RPC tracker, built on x86).

TVM's ``export_library`` links a CPU library with this machine's compiler (``g++``), which cannot
link objects of another architecture. For an LLVM target whose ``mtriple`` names another
architecture, ``fcompile`` is the GNU cross compiler of that triple (``aarch64-linux-gnu-gcc``
for ``aarch64-linux-gnu``, the Debian package ``gcc-aarch64-linux-gnu``); this machine cannot run
such a library, so its candidates are timed on a device behind ``--rpc-tracker``.
"""

from __future__ import annotations

import platform
import shutil
from typing import Any

_ARCH_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "x86-64": "x86_64"}


class CrossLinkerMissing(RuntimeError):
    """No cross compiler for a foreign target's architecture on this machine."""


def target_arch(target: Any) -> str | None:
    """The CPU architecture of an LLVM target's ``mtriple`` (e.g. ``aarch64``), None when unset or
    not an LLVM target."""
    if target.kind.name != "llvm":
        return None
    triple = str(target.attrs.get("mtriple", "") or "")
    if not triple:
        return None
    arch = triple.split("-")[0].lower()
    return _ARCH_ALIASES.get(arch, arch)


def is_foreign(target: Any) -> bool:
    """Whether ``target`` is a CPU of another architecture than this machine's (its libraries cannot
    be loaded or run here)."""
    arch = target_arch(target)
    host = platform.machine().lower()
    return arch is not None and arch != _ARCH_ALIASES.get(host, host)


def gnu_triple(target: Any) -> str:
    """The GNU toolchain prefix of the target's triple: ``aarch64-linux-gnu`` also for
    ``aarch64-unknown-linux-gnu``."""
    parts = str(target.attrs.get("mtriple", "")).split("-")
    if len(parts) == 4:  # arch-vendor-os-env
        parts = [parts[0], parts[2], parts[3]]
    return "-".join(parts)


def fcompile(target: Any) -> Any:
    """``export_library``'s ``fcompile`` for a library of ``target``: None where this machine links it,
    else the cross compiler of its triple. ``CrossLinkerMissing`` (one line) where none is installed."""
    if not is_foreign(target):
        return None
    from tvm.support import cc

    compiler = f"{gnu_triple(target)}-gcc"
    if shutil.which(compiler) is None:
        raise CrossLinkerMissing(f"no cross compiler {compiler} on this machine to link libraries for "
                                 f"{target_arch(target)} (Debian/Ubuntu: apt install gcc-{gnu_triple(target)})")
    return cc.cross_compiler(compiler)


def elf_machine(path: str) -> int:
    """The ELF ``e_machine`` of a shared library (62: x86-64, 183: AArch64)."""
    import struct

    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        raise ValueError(f"{path}: not an ELF file")
    return struct.unpack_from("<H", head, 18)[0]


def unrunnable(target: Any, remote: bool) -> str | None:
    """Why candidates for ``target`` cannot be measured from here (one line), None when they can:
    a foreign CPU's libraries need a device behind an RPC tracker (``remote``) and a cross compiler."""
    if not is_foreign(target):
        return None
    if not remote:
        return (f"{target_arch(target)} libraries cannot run on this {platform.machine()} machine: time them on a "
                f"device behind --rpc-tracker HOST:PORT --rpc-key KEY")
    try:
        fcompile(target)
    except CrossLinkerMissing as err:
        return str(err)
    return None
