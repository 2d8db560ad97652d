"""Errors the CLI reports as one clear line (bad input raises ValueError; these are the rest)."""


class BertforgeError(Exception):
    """A run could not go on, for a reason the message explains (with what to do next)."""


class TrainingDiverged(BertforgeError):
    """The loss stopped being finite; the last good checkpoint is left as it was."""
