"""Policies workers run: the Policy interface, built-in numpy policies, specs.

See docs/policies.md for the exact math of the built-ins, their parameter
names and shapes, and the policy spec JSON form.
"""

from rlfleet.policies.base import Policy, RowDraws
from rlfleet.policies.mlp import MLPCategoricalPolicy, MLPGaussianPolicy
from rlfleet.policies.random import RandomPolicy
from rlfleet.policies.spec import BUILTIN_POLICIES, PolicySpec, default_policy_spec, make_policy

__all__ = [
    "BUILTIN_POLICIES",
    "MLPCategoricalPolicy",
    "MLPGaussianPolicy",
    "Policy",
    "PolicySpec",
    "RandomPolicy",
    "RowDraws",
    "default_policy_spec",
    "make_policy",
]
