"""Errors the CLI reports as one clear line (bad input raises ValueError; these are the rest).

Exit codes the CLI gives them: UsageError 2 (the command line itself is wrong), any other
BertforgeError or ValueError 1 (the data or the run), TrainingInterrupted 130 (Ctrl-C).
"""


class BertforgeError(Exception):
    """A run could not go on, for a reason the message explains (with what to do next)."""


class UsageError(BertforgeError, ValueError):
    """An option or setting has a value the command cannot use (out of range, wrong type, conflicting).

    A ValueError too, so library callers that catch ValueError for bad arguments keep working.
    """


class TrainingDiverged(BertforgeError):
    """The loss stopped being finite; the last good checkpoint is left as it was."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped training after a checkpoint was saved; the message says how to resume.

    `stopped` says where it stopped and what was saved; `resume` what to run (a command that resumes by itself,
    adapt, raises it again with its own words).
    """

    RESUME = "run the same command with --resume to continue"

    def __init__(self, stopped: str, resume: str = RESUME):
        super().__init__(f"{stopped}: {resume}")
        self.stopped = stopped
