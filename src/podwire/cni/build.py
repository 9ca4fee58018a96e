"""Making the plugin executable a runtime runs: the C pipe where a compiler exists.

Interpreter start-up alone (tens of ms or more on a loaded VM) costs more than the reference
plugins' whole ADD (~10 ms, docs/benchmarks.md), so the C source ships in the package and is
compiled on the machine that runs it; the stdlib-only Python plugin, which behaves the same, is
the fallback where there is no compiler. The set-up script, ``podwire cni install`` and the
tests all build through here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import PermanentError

C_SOURCE = Path(__file__).with_name("c") / "podwire-cni.c"
PYTHON_PLUGIN = Path(__file__).with_name("plugin.py")
BUILT_NAME = "podwire-cni"
COMPILERS = ("gcc", "cc")


@dataclass(frozen=True)
class Plugin:
    path: Path
    how: str  # for the operator: which build this is and why


def prebuilt() -> Path | None:
    """The plugin the set-up script built next to this interpreter, if any."""
    path = Path(sys.executable).parent / BUILT_NAME
    return path if path.is_file() and os.access(path, os.X_OK) else None


def find_compiler() -> str | None:
    for name in COMPILERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def build(output: Path, compiler: str | None = None) -> Plugin:
    """Write the plugin to ``output`` atomically (a runtime may exec it at any moment)."""
    compiler = compiler or find_compiler()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        if compiler:
            _compile(compiler, tmp)
            how = f"C, built with {compiler}"
        else:
            shutil.copyfile(PYTHON_PLUGIN, tmp)
            how = "Python fallback: no C compiler (gcc, cc) found"
        os.chmod(tmp, 0o755)
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Plugin(output, how)


def _compile(compiler: str, output: Path) -> None:
    compile_c(compiler, C_SOURCE, output)


def compile_c(compiler: str, source: Path, output: Path) -> None:
    """The one way podwire compiles its C programs (the CNI pipe, the memif master)."""
    argv = [compiler, "-O2", "-Wall", "-o", str(output), str(source)]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise PermanentError(f"cannot run {compiler}: {exc.strerror}") from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit {result.returncode}"
        raise PermanentError(f"{compiler} failed to build {source}: {last}")
