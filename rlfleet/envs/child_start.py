"""Why a ``SubprocVectorEnv`` child died before it could build its env.

``spawn`` starts each child by re-importing the script's main module (so
that what the parent pickled by reference can be found), before any of
rlfleet's code runs there. A script that creates its vector env at import
time, without ``if __name__ == "__main__":``, then runs that code again in
every child, which fails; so does a main module that raises when imported
a second time. Nothing has been said on the pipe by then, so the parent
would only see the exit code.

So the parent names a private folder in ``RLFLEET_SUBPROC_NOTES`` (its
children inherit the environment), and a child still starting records the
exception that kills it there, as ``<pid>.json`` (:func:`record_start_failure`,
installed as ``sys.excepthook`` when this module is imported during a
child's start, i.e. when the main module imports rlfleet). The parent reads
that note when the child dies without having started
(:func:`start_failure_text`) and names the missing guard when that is the
cause.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing.process
import os
import shutil
import sys
import tempfile
import traceback
from types import TracebackType

from rlfleet.errors import UsageError

NOTES_ENV = "RLFLEET_SUBPROC_NOTES"
#: Says that a child died of the missing ``if __name__ == "__main__":`` guard.
_GUARD_MARKERS = ("bootstrapping phase", "re-imports the main module")
_NOTE_LIMIT = 20_000


def bootstrapping() -> bool:
    """Whether this process is a spawn child still importing its parent's main module."""
    return bool(getattr(multiprocessing.process.current_process(), "_inheriting", False))


def refuse_while_bootstrapping(what: str) -> None:
    """Refuses to start processes from a child's re-import of the main module.

    Raises:
        UsageError: Naming the missing guard, when called during a child's start.
    """
    if bootstrapping():
        raise UsageError(
            f"{what} was created while this child process re-imports the main module "
            f"{_main_path()}: spawn re-imports the main module in every child, so a script "
            "that creates its vector env at import time creates it again in each child. Put "
            'that code under `if __name__ == "__main__":`'
        )


def notes_dir() -> str:
    """The folder where this process's children record why they died (made once)."""
    existing = os.environ.get(NOTES_ENV)
    if existing and os.path.isdir(existing):
        return existing
    path = tempfile.mkdtemp(prefix="rlfleet-subproc-")  # mode 0700: this user's only
    os.environ[NOTES_ENV] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def record_start_failure(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    """``sys.excepthook`` of a starting child: writes the note, then prints as usual."""
    folder = os.environ.get(NOTES_ENV)
    if folder:
        text = "".join(traceback.format_exception(kind, value, tb))
        note = {
            "summary": f"{kind.__name__}: {value}"[:_NOTE_LIMIT],
            "traceback": text[-_NOTE_LIMIT:],
            "missing_guard": any(marker in str(value) for marker in _GUARD_MARKERS),
        }
        path = os.path.join(folder, f"{os.getpid()}.json")
        with contextlib.suppress(OSError), open(path, "w") as file:
            json.dump(note, file)
    sys.__excepthook__(kind, value, tb)


def start_failure_text(pid: int, exit_status: str) -> str:
    """The parent's account of a child that died before it started (reads and removes its note)."""
    note: dict[str, object] = {}
    folder = os.environ.get(NOTES_ENV)
    if folder:
        path = os.path.join(folder, f"{pid}.json")
        with contextlib.suppress(OSError, ValueError), open(path) as file:
            note = json.load(file)
        with contextlib.suppress(OSError):
            os.remove(path)
    where = f"its process died while starting ({exit_status}), before building its env"
    guard = (
        'put the code that creates the vector env under `if __name__ == "__main__":` (spawn '
        f"re-imports the main module {_main_path()} in every child)"
    )
    if not note:
        return (
            f"{where}, while re-importing the main module {_main_path()} (its traceback is on "
            f"stderr). The usual cause is a missing guard: {guard}"
        )
    if note.get("missing_guard"):
        return f"{where}: the script has no main guard; {guard}"
    return (
        f"{where}: re-importing the main module {_main_path()} (spawn does that in every "
        f"child) raised {note.get('summary')}\n--- traceback in the child ---\n"
        f"{str(note.get('traceback', '')).rstrip()}"
    )


def _main_path() -> str:
    # In a starting child the re-imported main module is __mp_main__.
    main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return repr(path) if path else "(interactive)"


if bootstrapping() and os.environ.get(NOTES_ENV):
    sys.excepthook = record_start_failure


__all__ = ["notes_dir", "refuse_while_bootstrapping", "start_failure_text"]
