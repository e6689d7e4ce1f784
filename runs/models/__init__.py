from .agents import Agent, ApiToken, ApprovalPolicy
from .freeze import CapabilityFreeze, StandingFreeze
from .history import Assumption, Checkpoint, HistoryEvent, Timer
from .intake import IntakeHold
from .ledger import AuthorityGrant, Effect, LedgerTally
from .run import Approval, ApprovalDecision, Attempt, ExecutionLease, Run, RunTally
from .teams import DEFAULT_TEAM, Team, TeamMembership

__all__ = [
    "DEFAULT_TEAM",
    "Agent",
    "ApiToken",
    "Approval",
    "ApprovalDecision",
    "ApprovalPolicy",
    "Assumption",
    "Attempt",
    "AuthorityGrant",
    "CapabilityFreeze",
    "Checkpoint",
    "Effect",
    "ExecutionLease",
    "HistoryEvent",
    "IntakeHold",
    "LedgerTally",
    "Run",
    "RunTally",
    "StandingFreeze",
    "Team",
    "TeamMembership",
    "Timer",
]
