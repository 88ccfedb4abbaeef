"""The coordinator's side of step-level env leases (protos/rlfleet/v1/leases.proto).

* :mod:`~rlfleet.coordinator.leases.manager`: placement, relay, loss and release.
* :mod:`~rlfleet.coordinator.leases.face`: the learner's ``Lease`` stream.
* :mod:`~rlfleet.coordinator.leases.translation`: lease messages to and from rlfleet types.
* :mod:`~rlfleet.coordinator.leases.data_server`: the lease data channel's selector loop.
* :mod:`~rlfleet.coordinator.leases.data_peers`: what a worker's data connection means to the fleet.
"""
