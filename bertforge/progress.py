"""Progress bars for long work, on a terminal and in a log.

On a terminal tqdm redraws its bar in place. Written to a file (nohup, a scheduler's log, `2> log`) it would add an
update at every batch, so there it waits LOG_INTERVAL_SECONDS before its first one and writes one at most that
often: a long job says how far it is and how long is left (an index of /usr/share/doc's 191,721 passages said nothing
for its whole run), and a short one, or one that fails at once, leaves its error as the only line (the command
line's one-line errors).
"""
from __future__ import annotations

import sys

from tqdm.auto import tqdm

LOG_INTERVAL_SECONDS = 30.0


def progress_bar(*, disable: bool = False, **options) -> tqdm:
    """tqdm(**options), showing on a terminal as tqdm does and in a log every LOG_INTERVAL_SECONDS."""
    if sys.stderr.isatty():
        return tqdm(disable=disable, **options)
    # smoothing 0: the rate (and time left) averaged since the start; tqdm's moving average of so few redraws gave
    # 2 hours left for a job 11 s from its end (valgrind's manual, 43% done after 50 s)
    return tqdm(disable=disable, delay=LOG_INTERVAL_SECONDS, mininterval=LOG_INTERVAL_SECONDS, smoothing=0,
                **options)
