"""Building ``podwire-memif``, the per-pod memif master, with the system compiler.

There is no interpreted fallback: a data path that copies frames must be compiled code, so a
node without the built program simply does not advertise ``memif`` (see ``find``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from podwire.cni.build import compile_c, find_compiler
from podwire.errors import PermanentError

C_SOURCE = Path(__file__).with_name("c") / "podwire-memif.c"
BUILT_NAME = "podwire-memif"


def find(configured: str = "") -> Path | None:
    """The master program: the configured path, else the one the set-up built next to this
    interpreter, else one on PATH; None when there is none (no memif on this node)."""
    candidates = [configured] if configured else [str(Path(sys.executable).parent / BUILT_NAME)]
    if not configured:
        candidates.append(shutil.which(BUILT_NAME) or "")
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def build(output: Path, compiler: str | None = None) -> Path:
    """Compile the master to ``output`` atomically (a running agent may start it any time)."""
    compiler = compiler or find_compiler()
    if compiler is None:
        raise PermanentError("no C compiler (gcc, cc) found: podwire-memif cannot be built")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        compile_c(compiler, C_SOURCE, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return output
