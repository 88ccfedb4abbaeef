"""The worker's side of step-level env leases (protos/rlfleet/v1/leases.proto).

* :mod:`~rlfleet.worker.leases.host`: ``LeaseHost``, the envs learners leased here.
* :mod:`~rlfleet.worker.leases.leased_env`: building one leased env and running one op on it.
* :mod:`~rlfleet.worker.leases.data_link`: the session's lease data connection.
"""
