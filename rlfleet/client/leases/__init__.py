"""The learner's side of step-level env leases (protos/rlfleet/v1/leases.proto).

* :mod:`~rlfleet.client.leases.remote_vector_env`: ``RemoteVectorEnv``,
  tianshou's vector env with its envs on fleet workers (public from ``rlfleet.client``).
* :mod:`~rlfleet.client.leases.lease_stream`: ``LeaseStream``, one ``Lease`` call.
"""
