"""The `kevin` command line.

Each subcommand lives in its own module listed in `COMMAND_MODULES`; the module exposes
`register(subparsers, parents)`, which adds its subparser (passing `parents` to every parser it
creates, so the global options work before or after the subcommand) and sets a `handler`
default: `handler(args, config) -> exit code`. Adding `kevin eval` later is one new module and
one line here.

Exit codes: 0 ok, 1 the operation failed, 2 usage error (bad arguments, unknown or ambiguous
digest prefix, missing confirmation). A reader that closes stdout early (`kevin cache ls | head -1`)
ends the command quietly with 0: no traceback.

A usage error is one line on stderr, `kevin: error: ...`, printed before anything slow starts (a
compile, a GPU check, a worker, a download); commands check their arguments first. A command
whose main job needs a CUDA GPU says so the same way where there is none (`require_cuda`).

Parsing imports no torch (most of a command's start-up time): the command modules import torch,
and the modules that need it, inside the functions that run a command, so `kevin --help`, every
`kevin COMMAND --help` and argparse's usage errors finish in a fraction of a second
(tests/test_cli_imports.py checks it, benchmarks/bench_cli.py times it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Callable, Final, NoReturn, Sequence

from kevin_backend.config import Config, ConfigError

__all__ = [
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_NO_VERDICT",
    "COMMAND_MODULES",
    "CommandError",
    "Handler",
    "build_parser",
    "config_from_args",
    "main",
    "require_cuda",
    "usage_error",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_NO_VERDICT: Final = 3  # the judge (or the model server) failed: no verdict, try again later

# Modules that each register one subcommand, in the order `kevin --help` lists them.
COMMAND_MODULES: Final[tuple[str, ...]] = ("kevin_backend.cli.generate_cmd", "kevin_backend.cli.prewarm_cmd", "kevin_backend.cli.eval_cmd", "kevin_backend.cli.cache_cmd", "kevin_backend.cli.train_cmd", "kevin_backend.cli.bench_cmd")

Handler = Callable[[argparse.Namespace, Config], int]


class CommandError(Exception):
    """Raised by a handler to stop with a message on stderr and an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _one_line(text: str) -> str:
    """A message as one line (multi-line texts, e.g. a YAML error's, joined with "; ")."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def usage_error(message: str) -> int:
    """Print `kevin: error: MESSAGE` as one line on stderr; the usage-error exit code."""
    print(f"kevin: error: {_one_line(message)}", file=sys.stderr)
    return EXIT_USAGE


def require_cuda(message: str) -> None:
    """Stop with a usage error (`message`, one line, exit 2) where torch sees no CUDA GPU: the
    check a command whose main job needs a GPU makes once its arguments are checked, before
    anything slow starts. `message` says what needs the GPU and, where there is one, what runs
    without it. A machine with no NVIDIA device at all is told so without importing torch."""
    if not _nvidia_devices():
        raise CommandError(message, EXIT_USAGE)
    import torch

    if not torch.cuda.is_available():
        raise CommandError(message, EXIT_USAGE)


def _nvidia_devices() -> bool:
    """Whether the machine shows any NVIDIA device (its device files or the driver's folder): where
    it does not, no CUDA GPU can be seen, and torch need not be imported (nor CUDA started) to say so."""
    import glob
    import os

    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.isdir("/proc/driver/nvidia/gpus")


class _Parser(argparse.ArgumentParser):
    """argparse with the project's form of a usage error: one `kevin: error: ...` line naming the
    command and where its help is, exit 2 (argparse's own form is the usage block, then the error)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{command}: " if command else ""
        usage_error(f"{where}{message} (see {self.prog} --help)")
        raise SystemExit(EXIT_USAGE)


def _global_options() -> argparse.ArgumentParser:
    """Options every (sub)command accepts.

    Their default is SUPPRESS so that a subparser which did not see the option does not
    overwrite the value given before the subcommand; read them with getattr(args, name, None).
    """
    options = _Parser(add_help=False)
    options.add_argument(
        "--cache-dir",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="user kernel cache folder (default: KEVIN_CACHE_DIR or ~/.cache/kevin_backend)",
    )
    options.add_argument(
        "--no-seed",
        action="store_true",
        default=argparse.SUPPRESS,
        help="ignore the seed cache shipped with the package",
    )
    return options


def build_parser() -> argparse.ArgumentParser:
    """The full `kevin` parser, with every module in COMMAND_MODULES registered."""
    common = _global_options()
    parser = _Parser(
        prog="kevin",
        description="Manage kevin_backend, the torch.compile backend that swaps in verified CUDA kernels.",
        parents=[common],
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers, [common])
    parser.set_defaults(handler=_help_handler(parser))
    return parser


def _help_handler(parser: argparse.ArgumentParser) -> Handler:
    """A handler for a command group called without its subcommand: print its help, usage error."""

    def handler(args: argparse.Namespace, config: Config) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    return handler


def config_from_args(args: argparse.Namespace) -> Config:
    """The environment's Config with the global command-line options applied on top."""
    changes: dict[str, object] = {}
    cache_dir = getattr(args, "cache_dir", None)
    if cache_dir is not None:
        changes["cache_dir"] = Path(cache_dir).expanduser()
    if getattr(args, "no_seed", False):
        changes["seed_cache"] = False
    return dataclasses.replace(Config.from_env(), **changes)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `kevin` with `argv` (default: sys.argv[1:]) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    try:
        config = config_from_args(args)
        return int(args.handler(args, config))
    except ConfigError as exc:
        return usage_error(str(exc))
    except CommandError as exc:
        print(f"kevin: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of stdout closed it (`kevin cache ls | head -1`): not the command's failure.
    stdout is pointed at the null device, so that nothing more (the interpreter's last flush at
    exit included) fails or prints a traceback, and the command ends with EXIT_OK."""
    import os

    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor (a test's buffer)
        pass
    return EXIT_OK


if __name__ == "__main__":
    # Run as `python -m kevin_backend.cli.main`, this file is `__main__`, a module apart from the
    # `kevin_backend.cli.main` the commands import: run that one, whose CommandError they raise.
    from kevin_backend.cli.main import main as _main

    sys.exit(_main())
