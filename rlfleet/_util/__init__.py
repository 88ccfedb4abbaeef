"""Private helpers every package may use: they import nothing of rlfleet but ``rlfleet.errors``.

* :mod:`~rlfleet._util.closing`: ``with obj:`` for objects that have a ``close()``.
* :mod:`~rlfleet._util.cpus`: taskset-style CPU lists, and pinning a process to CPUs.
* :mod:`~rlfleet._util.imports`: importing a user's ``module:attr`` reference, and
  a package's names imported on first use.
* :mod:`~rlfleet._util.log_limit`: log a repeated warning once per key or period.
* :mod:`~rlfleet._util.prebuilt`: frozen dataclass instances of values checked already.
* :mod:`~rlfleet._util.values`: checks of ints, floats and JSON objects from users and peers.
"""
