"""Example learners that train the built-in policies from fleet batches.

:class:`VPG` is a compact numpy policy-gradient learner for the
``mlp-categorical`` policy; :func:`train` is the sample-update loop the
``rlfleet demo`` command and the examples run against any sampler with
garage's ``obtain_samples`` contract (``LocalSampler``, ``RemoteSampler``).
"""

from rlfleet.learners.loop import IterationRecord, TrainingResult, train
from rlfleet.learners.vpg import VPG

__all__ = ["VPG", "IterationRecord", "TrainingResult", "train"]
