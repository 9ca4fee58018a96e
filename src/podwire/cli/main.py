"""The ``podwire`` command. Each subcommand lives in its own module with a ``register``.

Errors podwire raises on purpose end as one line on stderr and exit code 2 (bad input or
configuration) or 1 (anything retryable); never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from podwire import __version__
from podwire.errors import PodwireError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    # Imported here so that `podwire --version` does not pay for every subsystem.
    from podwire.cli import (
        agent_cmd,
        cni_cmd,
        config_cmd,
        controller_cmd,
        deviceplugin_cmd,
        etcd_cmd,
        kube_node_cmd,
        memif_cmd,
        neutron_agent_cmd,
        pools_cmd,
        stack_cmd,
        status_cmd,
        vm_cmd,
    )

    parser = argparse.ArgumentParser(prog="podwire", description=__doc__)
    parser.add_argument("--version", action="version", version=f"podwire {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = (
        stack_cmd,
        status_cmd,
        controller_cmd,
        pools_cmd,
        agent_cmd,
        cni_cmd,
        deviceplugin_cmd,
        etcd_cmd,
        memif_cmd,
        neutron_agent_cmd,
        kube_node_cmd,
        vm_cmd,
        config_cmd,
    )
    for module in modules:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except PodwireError as exc:
        return _report(args.command, exc)
    except BaseExceptionGroup as group:
        # A long-running command's TaskGroup wraps what stopped it.
        cause = _podwire_cause(group)
        if cause is None:
            raise
        return _report(args.command, cause)
    except KeyboardInterrupt:
        return 130


def _report(command: str, exc: PodwireError) -> int:
    print(f"podwire {command}: error: {exc}", file=sys.stderr)
    return 1 if exc.retryable else 2


def _podwire_cause(group: BaseExceptionGroup[BaseException]) -> PodwireError | None:
    """The first PodwireError in a (nested) exception group; None if there is none."""
    for exc in group.exceptions:
        if isinstance(exc, PodwireError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _podwire_cause(exc)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main())
