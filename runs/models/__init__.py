from .agents import Agent, ApiToken, ApprovalPolicy
from .history import Assumption, Checkpoint, HistoryEvent, Timer
from .ledger import AuthorityGrant, Effect
from .run import Approval, Attempt, ExecutionLease, Run

__all__ = [
    "Agent",
    "ApiToken",
    "Approval",
    "ApprovalPolicy",
    "Assumption",
    "Attempt",
    "AuthorityGrant",
    "Checkpoint",
    "Effect",
    "ExecutionLease",
    "HistoryEvent",
    "Run",
    "Timer",
]
