"""`bertforge` on the command line: one sub-command per function in `commands`.

The parser is derived from each function's signature and docstring (as litgpt does),
so a command's options cannot drift from the code that runs it.
"""
from __future__ import annotations

import argparse
import inspect
import logging
import sys
import typing

from . import commands
from .search import commands as search_commands
from .errors import BertforgeError

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
    "readmission": {  # bertforge readmission prepare|train|evaluate|report|score
        "prepare": commands.readmission_prepare,
        "train": commands.readmission_train,
        "evaluate": commands.readmission_evaluate,
        "report": commands.readmission_report,
        "score": commands.readmission_score,
    },
    "index": {"build": search_commands.index_build, "add": search_commands.index_add},
    "search": search_commands.search,
    "senses": search_commands.senses,
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
            options.update(nargs="+", type=args[0])
        elif kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = kind
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
    parser = argparse.ArgumentParser(prog="bertforge", description="BERT end to end: tokenize, embed, pretrain, fine-tune, predict, readmission.")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, function in COMMANDS.items():
        if isinstance(function, dict):  # a command group: its own sub-commands
            group = subparsers.add_parser(name, help=f"{name}: {', '.join(function)}")
            group.set_defaults(_function=None, _help=group.print_help)
            inner = group.add_subparsers(title=f"{name} commands", metavar="COMMAND")
            for inner_name, inner_function in function.items():
                add_command(inner, inner_name, inner_function)
        else:
            add_command(subparsers, name, function)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    arguments = vars(parser.parse_args(argv))
    function = arguments.pop("_function", None)
    print_help = arguments.pop("_help", parser.print_help)  # a group's sub-commands inherit it: always drop it
    if function is None:  # no command, or a group without its sub-command: say what there is
        print_help()
        return 2
    variadic = [p.name for p in inspect.signature(function).parameters.values() if p.kind is inspect.Parameter.VAR_POSITIONAL]
    positional = arguments.pop(variadic[0]) if variadic else []
    try:
        function(*positional, **arguments)
    except (ValueError, BertforgeError) as error:  # one clear line, no traceback
        print(f"bertforge: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
