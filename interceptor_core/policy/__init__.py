"""Policy files: tool-call policy as data that security teams write, review and test.

A policy is a YAML file (`version: 1`) of rules with CEL conditions; `load_policy(path)` reads
it into a `Policy`, an interceptor that goes anywhere Python interceptors go. docs/policies.md
states the format and the semantics; `callgate policy check|test|explain` lints, tests and
explains policies without running any tool.
"""

from interceptor_core.policy._policy import (
    DECISIONS,
    PRECEDENCE,
    Evaluation,
    Policy,
    PolicyError,
    PolicyEvaluationError,
    Rule,
    RuleOutcome,
    load_policy,
)
from interceptor_core.policy._source import Problem

__all__ = [
    "DECISIONS",
    "PRECEDENCE",
    "Evaluation",
    "Policy",
    "PolicyError",
    "PolicyEvaluationError",
    "Problem",
    "Rule",
    "RuleOutcome",
    "load_policy",
]
