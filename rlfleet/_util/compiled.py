"""rlfleet's C modules imported with one error for a checkout that never compiled them.

rlfleet compiles small C modules (pyproject.toml's ext-modules): the
built-in MLP policies' kernel and, on the data path, the result reader,
the one-pass result check and its layouts' skeleton builder, the answer
gather, the learner's view check, the scheduler's unit booking and
dealing, the episodes' seed hash, and a native worker's pass over its
finished episodes. pip builds them; a source
checkout run without building them gets :class:`NotInstalledError` saying
how, the same text for each (``tests/test_compiled_modules.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rlfleet.errors import NotInstalledError


@contextlib.contextmanager
def compiled(what: str, source: str) -> Iterator[None]:
    """Turns a missing C module imported in the block into :class:`NotInstalledError`.

    Args:
        what: What the module is, as the error names it ("result reader").
        source: Its C source in the repository ("rlfleet/wire/_result_reader.c").

    Raises:
        NotInstalledError: If the block's import finds no such module.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        raise NotInstalledError(
            f"rlfleet's compiled {what} ({source}) is not built: install rlfleet with pip, which "
            "compiles it (a C compiler is needed), or in a source checkout run: "
            'python -c "from setuptools import setup; setup()" build_ext --inplace'
        ) from exc
