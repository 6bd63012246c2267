"""IAM's policy simulator (``SimulatePrincipalPolicy``), which moto lacks: the question "may this principal
do these actions?" that the create form asks before it offers a create.

The sandbox does not enforce identity policies (``sandbox/README.md``), so every action is ``allowed`` for a
principal that exists — except an action an ``access_denied`` fault names (target ``service`` and
``action``: the API operation, e.g. ``iam`` / ``PassRole``), which reads ``implicitDeny`` while the fault is
armed; simulating never uses the fault up. An unknown principal is ``NoSuchEntity``, as in IAM.
"""

from __future__ import annotations

from typing import Any

from .base import AwsError, Call, FaultRegistry
from .facts import MotoFacts

MAX_ACTIONS = 1000  # what one SimulatePrincipalPolicy page evaluates at most (MaxItems)


class IamPolicySimulator:
    service = "iam"
    operations = frozenset({"SimulatePrincipalPolicy"})

    def __init__(self, faults: FaultRegistry, facts: MotoFacts, account: str) -> None:
        self.faults = faults
        self.facts = facts
        self.account = account

    def tick(self, now: float) -> None:
        """Nothing here changes with time."""

    def handle(self, call: Call) -> dict[str, Any]:
        source = str(call.params["PolicySourceArn"])
        if not self._exists(source):
            raise AwsError("NoSuchEntity", f"The principal {source} cannot be found.", 404)
        denied = {(f.target.get("service", ""), f.target.get("action", "")) for f in self.faults.list()
                  if f.kind == "access_denied"}
        results = []
        for action in list(call.params.get("ActionNames") or [])[:MAX_ACTIONS]:
            service, _, name = str(action).partition(":")
            decision = "implicitDeny" if (service, name) in denied else "allowed"
            results.append({"EvalActionName": action, "EvalResourceName": "*", "EvalDecision": decision,
                            "MatchedStatements": [], "MissingContextValues": []})
        return {"EvaluationResults": results, "IsTruncated": False}

    def _exists(self, arn: str) -> bool:
        """An IAM user or role of moto's IAM, or the principal the sandbox's own credentials sign as."""
        return arn == self.facts.own_principal() or self.facts.principal_exists(arn)
