"""`bertforge` on the command line: one sub-command per function in COMMANDS.

jsonargparse derives each sub-command's options from its function's signature and docstring (a
dataclass parameter contributes its fields, with `--config FILE` and `--print-config`), so a
command's options cannot drift from the code that runs it; `options.command_line_style` keeps
the command line's argparse spellings. Numeric options are checked against the bounds declared
once in `validation.BOUNDS`, and every error a user can cause ends as one line and an exit code
(`boundary`); `bertforge --debug ...` shows the traceback.
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import sys
import typing

import docstring_parser
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from ..engine.threads import spin_briefly, use_threads
from ..serve import commands as serve_commands
from ..tasks.retrieval import commands as sbert_commands
from . import adapt_commands, commands, export, finetune_commands, readmission_commands, search_commands
from .boundary import INTERRUPTED, USAGE, describe, report
from .options import command_line_style
from .stop_signals import StopSignals

REQUIRED = "the following arguments are required: "
THREADS_HELP = ("CPU threads (default: OMP_NUM_THREADS if set, else the physical cores this process may use; "
                "inference chooses batch by batch among them, the fewer when other processes share the machine)")
COMMANDS = {
    "demo": commands.demo,
    "tokenize": commands.tokenize,
    "embed": commands.embed_texts,
    "info": commands.info,
    "fill-mask": commands.fill_mask,
    "train-tokenizer": commands.train_tokenizer,
    "prepare": commands.prepare,
    "pretrain": commands.pretrain,
    "finetune": finetune_commands.finetune,
    "predict": finetune_commands.predict,
    "baseline": finetune_commands.baseline,
    "index": {"build": search_commands.index_build, "add": search_commands.index_add,
              "weight": search_commands.index_weight},
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
    "adapt": adapt_commands.adapt,
    "sbert": {"train": sbert_commands.train, "evaluate": sbert_commands.evaluate, "prepare": sbert_commands.prepare},
}


# Options of a command line that --print-config leaves out of the file it prints (CommandParser.dump).
NOT_SETTINGS = ("overwrite", "threads")


class CommandParser(ArgumentParser):
    """jsonargparse's parser with bertforge's command-line conventions (see `options`) and one-line errors."""

    def __init__(self, *args, print_config: str | None = None, **kwargs):
        # jsonargparse's --print_config comes with a --config file of a dataclass's options; it is given
        # the spelling of every other option here (and of the recipe commands' own --print-config).
        super().__init__(*args, print_config=print_config, **kwargs)
        self.commands: dict[str, CommandParser] = {}  # its sub-commands' parsers, by name
        self.takes_threads = False  # a command's own parser: whether main applies its --threads (command_parser)
        # `--layers -4,-3,-2,-1`: argparse before Python 3.13 reads "-4,-3,-2,-1" as an unknown option
        # (only -4 and -.5 were negative numbers to it); this is the test argparse itself uses from 3.13.
        self._negative_number_matcher = re.compile(r"-\.?\d")

    def dump(self, cfg, *args, **kwargs) -> str:
        """jsonargparse's dump (what --print-config prints) without the options that are no setting of the run:
        a printed file given to --config must not make the next run delete the one before it (--overwrite), nor
        pin this machine's thread count on another (--threads)."""
        cfg = cfg.clone()
        for key in NOT_SETTINGS:
            cfg.pop(key, None)
        return super().dump(cfg, *args, **kwargs)

    def add_argument(self, *args, **kwargs):
        """jsonargparse's add_argument with a typed parameter's option in bertforge's spelling.

        jsonargparse gives the argument groups it creates the same override.
        """
        args, kwargs = command_line_style(args, kwargs)
        return super().add_argument(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> typing.NoReturn:
        """A usage error as one line (what was wrong, where the help is) and exit code 2."""
        if not self.exit_on_error:  # a parser jsonargparse uses internally: it catches the error
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        if message.startswith(REQUIRED):
            parser, message = self.missing(message[len(REQUIRED):].split(", "))
        prog = parser.prog.replace(" [options]", "")
        self.exit(USAGE, f"{prog}: error: {' '.join(message.split())} (see {prog} --help)\n")

    def missing(self, keys: list[str]) -> tuple[CommandParser, str]:
        """jsonargparse checks required arguments last, naming them by key (readmission.train.output):
        say it as argparse did, in the sub-command's words (--output)."""
        *words, _ = keys[0].split(".")
        parser = self
        for word in words:
            parser = parser.commands[word]
        names = {action.dest: (action.option_strings or [action.dest])[0] for action in parser._actions}
        return parser, REQUIRED + ", ".join(names.get(key.split(".")[-1], key) for key in keys)

    def _parse_known_args(self, *args, **kwargs):
        # argparse fills a positional from one run of words, so in `finetune epochs=2 --resume lr=1`
        # the override after --resume is left over; overrides stay overrides wherever they stand.
        namespace, extra = super()._parse_known_args(*args, **kwargs)
        trailing = next((a for a in self._actions if not a.option_strings and a.nargs == "*"), None)
        if trailing and extra and all("=" in word and not word.startswith("-") for word in extra):
            namespace[trailing.dest] = [*(namespace.get(trailing.dest) or []), *extra]
            extra = []
        return namespace, extra


def settings_classes(function) -> dict[str, type]:
    """The function's parameters typed with a dataclass (each field becomes an option): {name: class}."""
    hints = typing.get_type_hints(function)
    return {name: kind for name, kind in hints.items() if dataclasses.is_dataclass(kind)}


def command_parser(function) -> CommandParser:
    """The options of one sub-command, from `function`'s signature and docstring."""
    doc = docstring_parser.parse(inspect.getdoc(function) or "")
    classes = settings_classes(function)
    parser = CommandParser(description=doc.short_description, print_config="--print-config" if classes else None)
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:  # *overrides, *texts: any number of words
            helps = {p.arg_name: p.description for p in doc.params}
            parser.add_argument(parameter.name, nargs="*", default=[], help=helps.get(parameter.name, ""))
    parser.add_function_arguments(function, skip=set(classes), as_positional=True, as_group=False)
    for kind in classes.values():
        parser.add_class_arguments(kind, as_group=False)
        parser.add_argument("--config", action=ActionConfigFile,
                            help="a YAML file of these options (write one with --print-config)")
    parser.takes_threads = not any(action.dest == "threads" for action in parser._actions)  # serve has its own
    if parser.takes_threads:
        parser.add_argument("--threads", type=typing.Optional[int], default=None, help=THREADS_HELP)
    return parser


def build_parser() -> CommandParser:
    parser = CommandParser(prog="bertforge", description="BERT end to end: tokenize, embed, pretrain, fine-tune, "
                                                         "predict, readmission.")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    add_commands(parser, COMMANDS)
    return parser


def add_commands(parser: CommandParser, commands: dict) -> None:
    subcommands = parser.add_subcommands(required=False, title="commands", metavar="COMMAND")
    for name, function in commands.items():
        if isinstance(function, dict):  # a command group (readmission): its own sub-commands
            parser.commands[name] = CommandParser(description=f"{name}: {', '.join(function)}")
        else:
            parser.commands[name] = command_parser(function)
        subcommands.add_subcommand(name, parser.commands[name], help=parser.commands[name].description)
    for name, function in commands.items():  # jsonargparse adds nested sub-commands after their level
        if isinstance(function, dict):
            add_commands(parser.commands[name], function)


def selected_command(parser: CommandParser, parsed: Namespace) -> tuple[typing.Callable | None, dict, CommandParser]:
    """(the function of the command given, its arguments, its parser); no function for a missing command."""
    commands, node = COMMANDS, parsed
    while True:
        name = node.get("subcommand")
        if name is None:
            return None, {}, parser
        parser = parser.commands[name]
        commands, node = commands[name], node[name]
        if not isinstance(commands, dict):
            return commands, node.as_dict(), parser


def run_command(function, arguments: dict) -> None:
    """`function` with the parsed arguments: words for *args, dataclass parameters built from their fields."""
    classes = settings_classes(function)
    positional, keywords = [], {}
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            positional = list(arguments.get(parameter.name) or [])
        elif parameter.name in classes:
            fields = [field.name for field in dataclasses.fields(classes[parameter.name]) if field.init]
            keywords[parameter.name] = classes[parameter.name](**{name: arguments[name] for name in fields})
        else:
            keywords[parameter.name] = arguments[parameter.name]
    function(*positional, **keywords)


def config_first(argv: list[str]) -> list[str]:
    """argv with each `--config FILE` moved before the command's other options, so that an option typed on the
    command line wins over the file wherever it is typed, in every command (finetune, pretrain and sbert train merge
    their recipes so; jsonargparse applies a config file where it stands: `readmission train --seed 1 --config r.yaml`
    ran with the file's seed 0, and `serve --port 9100 --config f.yaml` on the file's port)."""
    commands, position = COMMANDS, 0
    while position < len(argv) and (argv[position] == "--debug" or (
            isinstance(commands, dict) and argv[position] in commands)):
        commands = commands if argv[position] == "--debug" else commands[argv[position]]
        position += 1
    configs, others, rest = [], [], argv[position:]
    index = 0
    while index < len(rest):
        width = 2 if rest[index] == "--config" and index + 1 < len(rest) else 1
        (configs if rest[index] == "--config" or rest[index].startswith("--config=") else others).extend(
            rest[index:index + width])
        index += width
    return argv[:position] + configs + others


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (0, 1 failed, 2 usage, 130 interrupted)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        parser = build_parser()
        parsed = parser.parse_args(config_first(list(sys.argv[1:] if argv is None else argv)))
    except SystemExit as exit:  # --help, --print-config (0) or a usage error, already printed
        return exit.code if isinstance(exit.code, int) else USAGE
    except KeyboardInterrupt as error:  # Ctrl-C while the parser is built: the same line as during a command
        return report(*describe(error, "bertforge"))
    function, arguments, command = selected_command(parser, parsed)
    if function is None:  # no command, or a group without its sub-command: say what there is
        command.print_help()
        return USAGE
    spin_briefly()  # before the command imports torch
    if command.takes_threads:
        use_threads(arguments.pop("threads"))
    with StopSignals() as signals:
        try:
            run_command(function, arguments)
        except BaseException as error:
            if parsed.debug or isinstance(error, SystemExit):
                raise
            described = describe(error, function.__name__)
            if signals.received and (described is None or described[1] != INTERRUPTED):
                described = signals.message(), INTERRUPTED  # a library's error in place of the Ctrl-C it swallowed
            if described is None:
                raise
            return report(*described)
    return 0
