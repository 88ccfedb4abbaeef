"""The protocol in rlfleet's own types, shared by every side (no protobuf, no gRPC).

What a worker, the coordinator, a learner and the conformance kit say to
each other, as dataclasses: the Join stream (:mod:`~rlfleet.protocol.join`),
the learner's calls (:mod:`~rlfleet.protocol.learner_calls`), agent and env
updates (:mod:`~rlfleet.protocol.updates`), error reports, sampling modes,
fragment stream replays, multi-agent naming and episode units as columns. ``rlfleet.wire`` and the
faces' translation modules turn them into protobuf messages and back.
"""
