"""Operator calls of the protocol (interventions, reconciliation), mixed into :class:`Client`.

Worker code does not need these; they are handy for scripts, demos and end-to-end tests. They need an
operator token (a worker token is refused with 403).
"""

from __future__ import annotations

from typing import Any

from ._core import intervention_body

JSON = dict[str, Any]

__all__ = ["OperatorCalls"]


class OperatorCalls:
    """``/interventions`` and ``/reconcile`` calls; ``Client`` provides ``_call``."""

    def _call(self, method: str, path: str, body: Any = None, *, retry: bool, **kw: Any) -> JSON:
        raise NotImplementedError  # pragma: no cover

    _intervention_body = staticmethod(intervention_body)

    def preview_intervention(
        self,
        run_id: str,
        kind: str,
        reason: str,
        scope: str = "run",
        options: JSON | None = None,
        override_reason: str | None = None,
    ) -> JSON:
        """``POST /runs/{id}/interventions/preview`` (``scope``: ``run`` or ``tree``)."""
        body = self._intervention_body(kind, reason, scope, options, override_reason)
        return self._call("POST", f"/runs/{run_id}/interventions/preview", body, retry=True)

    def intervene(
        self,
        run_id: str,
        kind: str,
        reason: str,
        scope: str = "run",
        options: JSON | None = None,
        override_reason: str | None = None,
    ) -> JSON:
        """``POST /runs/{id}/interventions`` → the intervention and its receipt (not retried)."""
        body = self._intervention_body(kind, reason, scope, options, override_reason)
        return self._call("POST", f"/runs/{run_id}/interventions", body, retry=False)

    def get_intervention(self, intervention_id: str) -> JSON:
        """``GET /interventions/{id}``: receipt and job results."""
        return self._call("GET", f"/interventions/{intervention_id}", retry=True)

    def decide_approval(self, run_id: str, approval_id: str, approve: bool, reason: str) -> JSON:
        """Approve (or reject) a run's pending approval: the ``approve``/``reject`` intervention
        with ``options.approval_id``. Needs the token of someone with the approver role."""
        kind = "approve" if approve else "reject"
        return self.intervene(run_id, kind, reason, options={"approval_id": approval_id})

    def reconcile_effect(
        self,
        effect_id: str,
        outcome: str,
        evidence: str,
        reason: str,
        external_ref: str | None = None,
    ) -> JSON:
        """``POST /effects/{id}/reconcile`` with evidence (operator; not retried)."""
        body = {
            "outcome": outcome,
            "evidence": evidence,
            "reason": reason,
            "external_ref": external_ref or "",
        }
        return self._call("POST", f"/effects/{effect_id}/reconcile", body, retry=False)
