"""The registry's tables: the catalog, its template versions, checks, events and probes."""

from __future__ import annotations

from .catalog import (
    REPO_ID_INPUT_PATTERN,
    REPO_ID_RE,
    SEARCH_TERMS,
    DiscoveryRun,
    Drift,
    HubModel,
    HubModelQuerySet,
    ModelFormat,
    ModelStatus,
    NamedTemplate,
    SourceFile,
    TemplateChange,
    TemplateSnapshot,
    TemplateVersion,
    TemplateVersionQuerySet,
    TokenizerFile,
    Verdict,
    Watch,
    WatchKind,
    WatchQuerySet,
    search_terms,
    validate_repo_id,
)
from .check_runs import CatalogVerdict, CheckRun, CheckStatus, ProbeStatus, Thinking, Tools
from .events import EventKind, ModelEvent
from .leases import Lease
from .outbox import OutboxMessage
from .probes import PROBE_SEVERITY, ProbeRun, ProbeRunQuerySet, ProbeState, ProbeVerdict

__all__ = [
    "PROBE_SEVERITY",
    "REPO_ID_INPUT_PATTERN",
    "REPO_ID_RE",
    "CatalogVerdict",
    "CheckRun",
    "CheckStatus",
    "DiscoveryRun",
    "Drift",
    "EventKind",
    "HubModel",
    "HubModelQuerySet",
    "Lease",
    "ModelEvent",
    "ModelFormat",
    "ModelStatus",
    "OutboxMessage",
    "NamedTemplate",
    "ProbeRun",
    "ProbeRunQuerySet",
    "ProbeState",
    "ProbeStatus",
    "ProbeVerdict",
    "SourceFile",
    "TemplateChange",
    "TemplateSnapshot",
    "TemplateVersion",
    "TemplateVersionQuerySet",
    "Thinking",
    "TokenizerFile",
    "Tools",
    "Verdict",
    "Watch",
    "WatchKind",
    "WatchQuerySet",
    "SEARCH_TERMS",
    "search_terms",
    "validate_repo_id",
]
