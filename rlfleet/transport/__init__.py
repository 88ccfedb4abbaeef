"""How bytes move between processes.

* :mod:`~rlfleet.transport.rpc`: the gRPC boundary every face shares (channel
  and server options, chunk-aware (de)serializers, errors as status details).
* :mod:`~rlfleet.transport.lease_channel`: the lease data channel, dialling
  side (framed TCP or TLS to the coordinator).
* :mod:`~rlfleet.transport.data_address`: the host a data channel dials,
  and the warning when its port is out of reach.
* :mod:`~rlfleet.transport.in_process_link`: the same channel in memory, for
  a learner in the coordinator's process (``Fleet.local``).
"""
