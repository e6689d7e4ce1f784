"""Close: the accountable owner ends the case. Nothing further happens to the run."""

from __future__ import annotations

from typing import Any

from core.actors import Actor
from interventions import facts
from interventions.base import Contract, Request, register
from interventions.models import Intervention
from runs.models import Run
from runs.services.decisions import apply_transition
from runs.states import Event


def preview(run: Run, req: Request, actor: Actor) -> dict[str, Any]:
    return {
        "committed_effects": facts.committed_effects(run),
        "unresolved_effects": facts.unresolved_effects(run),
        "note": "closing is final: no retry, compensation or resume afterwards",
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> dict[str, Any]:
    apply_transition(run, Event.CLOSE, actor=actor, reason=req.reason)
    return {"state": run.state, "committed_effects": facts.committed_effects(run)}


register(Contract(kind="close", event=Event.CLOSE, preview=preview, apply=apply))
