"""The process's loom session, where every module can reach it.

`control` sets it (loom.enable(), loom.pool()) and clears it; markers,
stats and integrations read it. Kept apart so that those modules do not
import `control` (which imports the planner and, lazily, the PyTorch glue):
the package has no import circle. No torch here.
"""

import threading

from loom.errors import LoomError

lock = threading.RLock()  # guards changes of the session (enable, reset)
_session = None


def current():
    """The process's Session, or None when loom is not enabled."""
    return _session


def require(what):
    """The session; LoomError naming `what` when loom is not enabled."""
    session = _session
    if session is None:
        raise LoomError(f"{what}: loom is not enabled in this process (call "
                        f"loom.enable() first)")
    return session


def set_current(session):
    """Makes `session` (or None) the process's session. Callers hold
    `lock`."""
    global _session  # pylint: disable=global-statement
    _session = session
