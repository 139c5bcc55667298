"""The one family of errors meshplan raises for bad input.

Each message says what failed, the actual number against the expected one, and what to do next.
"""


class PlanError(ValueError):
    """Base of every error meshplan raises on purpose."""


class InfeasibleError(PlanError):
    """No plan fits the cluster (memory, divisibility)."""


class UnsupportedModelError(PlanError):
    """The model cannot be traced or uses something meshplan does not handle."""


class InvalidClusterError(PlanError):
    """A cluster spec, preset or profile is malformed or unknown."""


class InvalidPlanError(PlanError):
    """A plan (file or value) is malformed, from another schema, or inconsistent."""


class UnknownModelError(PlanError):
    """A zoo name that does not exist."""
