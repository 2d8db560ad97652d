"""`bertforge` on the command line: one sub-command per function in `commands`.

The parser is derived from each function's signature and docstring (as litgpt does),
so a command's options cannot drift from the code that runs it. Numeric options are checked
against the bounds declared once in `validation.BOUNDS`, and every error a user can cause
ends as one line and an exit code (`boundary`); `bertforge --debug ...` shows the traceback.
"""
from __future__ import annotations

import argparse
import inspect
import logging
import signal
import sys
import typing

from ..search import commands as search_commands
from ..serve import commands as serve_commands
from ..tasks.retrieval import commands as sbert_commands
from ..validation import BOUNDS
from . import commands, export, readmission_commands
from .boundary import USAGE, describe, report

COMMANDS = {
    "demo": commands.demo,
    "tokenize": commands.tokenize,
    "embed": commands.embed,
    "info": commands.info,
    "fill-mask": commands.fill_mask,
    "train-tokenizer": commands.train_tokenizer,
    "prepare": commands.prepare,
    "pretrain": commands.pretrain,
    "finetune": commands.finetune,
    "predict": commands.predict,
    "baseline": commands.baseline,
    "index": {"build": search_commands.index_build, "add": search_commands.index_add},
    "search": search_commands.search,
    "senses": search_commands.senses,
    "serve": serve_commands.serve,
    "export": {"onnx": export.onnx},  # bertforge export onnx
    "readmission": {  # bertforge readmission prepare|train|evaluate|report|score
        "prepare": readmission_commands.readmission_prepare,
        "train": readmission_commands.readmission_train,
        "evaluate": readmission_commands.readmission_evaluate,
        "report": readmission_commands.readmission_report,
        "score": readmission_commands.readmission_score,
    },
    "sbert": {"train": sbert_commands.train, "evaluate": sbert_commands.evaluate, "prepare": sbert_commands.prepare},
}


def parameter_help(doc: str) -> dict[str, str]:
    """`name: text` lines of a docstring's Args section -> {name: text}."""
    helps, in_args = {}, False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped == "Args:":
            in_args = True
        elif in_args and ":" in stripped:
            name, text = stripped.split(":", 1)
            helps[name.strip()] = text.strip()
    return helps


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong, where the help is) and exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def bounded(kind: type, name: str):
    """An argparse type for an int/float option that also checks the bound declared for `name`."""
    bound = BOUNDS.get(name)

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        problem = bound.problem(value) if bound else None
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def add_command(subparsers, name: str, function) -> None:
    doc = inspect.getdoc(function) or ""
    summary = doc.split("\n\n")[0]
    parser = subparsers.add_parser(name, help=summary, description=summary,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    helps = parameter_help(doc)
    hints = typing.get_type_hints(function)
    for parameter in inspect.signature(function).parameters.values():
        kind = hints.get(parameter.name, str)
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        options: dict = {"help": helps.get(parameter.name, "")}
        if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
            kind = next(a for a in args if a is not type(None))  # Optional[X] -> X
            origin, args = typing.get_origin(kind), typing.get_args(kind)
        if origin is list:
            options.update(nargs="+", type=bounded(args[0], parameter.name) if args[0] in (int, float) else args[0])
        elif kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = bounded(kind, parameter.name) if kind in (int, float) else kind
        required = parameter.default is inspect.Parameter.empty
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:  # *overrides: any number of trailing words
            parser.add_argument(parameter.name, nargs="*", type=kind, help=options["help"])
        elif required and parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            parser.add_argument(parameter.name, **options)  # positional
        elif required:  # keyword-only without a default: a required --option
            parser.add_argument("--" + parameter.name.replace("_", "-"), dest=parameter.name, required=True, **options)
        else:
            flag = "--" + parameter.name.replace("_", "-")
            parser.add_argument(flag, dest=parameter.name, default=parameter.default, **options)
    parser.set_defaults(_function=function)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="bertforge", description="BERT end to end: tokenize, embed, pretrain, fine-tune, predict, readmission.")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=OneLineParser)
    for name, function in COMMANDS.items():
        if isinstance(function, dict):  # a command group: its own sub-commands
            group = subparsers.add_parser(name, help=f"{name}: {', '.join(function)}")
            group.set_defaults(_function=None, _help=group.print_help)
            inner = group.add_subparsers(title=f"{name} commands", metavar="COMMAND", parser_class=OneLineParser)
            for inner_name, inner_function in function.items():
                add_command(inner, inner_name, inner_function)
        else:
            add_command(subparsers, name, function)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (0, 1 failed, 2 usage, 130 interrupted)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    try:
        # `--layers -4,-3,-2,-1`: a negative-number list is the option's value, not an option of its own.
        arguments, extra = parser.parse_known_args(commands.attach_negative_lists(sys.argv[1:] if argv is None else argv))
        arguments = vars(arguments)
        function = arguments.pop("_function", None)
        variadic = [p.name for p in inspect.signature(function).parameters.values()
                    if p.kind is inspect.Parameter.VAR_POSITIONAL] if function else []
        # `--resume epochs=2`: argparse takes trailing words only before the first option; overrides
        # (key=value) after an option are still overrides.
        if extra and not (variadic and all("=" in word and not word.startswith("-") for word in extra)):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exit:  # argparse: --help (0) or a usage error, already printed
        return exit.code if isinstance(exit.code, int) else USAGE
    debug = arguments.pop("debug")
    print_help = arguments.pop("_help", parser.print_help)  # a group's sub-commands inherit it: always drop it
    if function is None:  # no command, or a group without its sub-command: say what there is
        print_help()
        return USAGE
    positional = [*arguments.pop(variadic[0]), *extra] if variadic else []
    previous = terminate_as_interrupt()
    try:
        function(*positional, **arguments)
    except BaseException as error:
        described = None if debug or isinstance(error, SystemExit) else describe(error, function.__name__)
        if described is None:
            raise
        return report(*described)
    finally:
        restore_terminate(previous)
    return 0


def terminate_as_interrupt():
    """SIGTERM (what `kill`, a scheduler or a container stop sends) ends a command as Ctrl-C does:
    cleanly, with its one-line message; training saves a checkpoint first (train/interrupt.py)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt("interrupted by SIGTERM")

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread (the CLI called from a worker thread): leave signals alone
        return None


def restore_terminate(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
