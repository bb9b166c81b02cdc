"""The OpenAPI 3.1 description of the JSON API, written by hand: small, and read by people."""

from __future__ import annotations

from typing import Any

VERDICTS = ["pending", "safe", "unsafe", "safe_where_renderable", "error"]
PROBE_VERDICTS = ["hit", "partial", "miss", "wrong"]


def _param(name: str, where: str, description: str, **schema: Any) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _ok(description: str, ref: str) -> dict[str, Any]:
    return {
        "200": {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
        },
        "404": {"description": "Not found"},
    }


SHA = _param("sha256", "path", "SHA-256 of the template text", pattern="^[0-9a-f]{64}$")
ORG = _param("org", "path", "Repository owner on the Hub")
NAME = _param("name", "path", "Repository name on the Hub")

COMPONENTS: dict[str, Any] = {
    "schemas": {
        "Verdict": {"type": "string", "enum": VERDICTS},
        "ModelRow": {
            "type": "object",
            "properties": {
                "repo_id": {"type": "string"},
                "author": {"type": "string"},
                "family": {"type": "string"},
                "status": {"type": "string"},
                "verdict": {"$ref": "#/components/schemas/Verdict"},
                "summary": {"type": "string"},
                "thinking": {"type": ["string", "null"], "enum": ["none", "same", "differs", None]},
                "thinking_off": {"type": ["string", "null"]},
                "thinking_on": {"type": ["string", "null"]},
                "tools": {"type": ["string", "null"]},
                "probe": {"type": "string"},
                "is_hybrid": {"type": "boolean"},
                "downloads": {"type": "integer"},
                "last_template_change_at": {"type": ["string", "null"], "format": "date-time"},
                "url": {"type": "string", "format": "uri"},
            },
            "required": ["repo_id", "verdict", "url"],
        },
        "ModelList": {
            "type": "object",
            "properties": {
                "count": {"type": "integer"},
                "page": {"type": "integer"},
                "pages": {"type": "integer"},
                "next": {"type": ["string", "null"], "format": "uri"},
                "previous": {"type": ["string", "null"], "format": "uri"},
                "results": {"type": "array", "items": {"$ref": "#/components/schemas/ModelRow"}},
            },
            "required": ["count", "page", "pages", "results"],
        },
        "Failure": {
            "type": "object",
            "properties": {
                "variant": {"type": "string"},
                "session": {"type": "string"},
                "request_index": {"type": "integer"},
                "status": {"type": "string", "enum": ["fail", "warn"]},
                "cause": {
                    "type": ["string", "null"],
                    "enum": [
                        "history",
                        "generation_prompt",
                        "assistant_output",
                        "token_seam",
                        None,
                    ],
                },
                "detail": {"type": "string"},
                "byte_offset": {"type": ["integer", "null"]},
                "token_index": {"type": ["integer", "null"]},
                "segment": {"type": ["string", "null"]},
                "template_lines": {"type": "array", "items": {"type": "integer"}},
                "reusable_share": {"type": "number"},
                "diff_url": {"type": "string", "format": "uri"},
            },
        },
        "Check": {
            "type": "object",
            "properties": {
                "template_sha256": {"type": "string"},
                "engine_version": {"type": "string"},
                "status": {"type": "string", "enum": ["pending", "running", "done", "failed"]},
                "progress": {"type": "integer"},
                "verdict": {"$ref": "#/components/schemas/Verdict"},
                "summary": {"type": "string"},
                "finished_at": {"type": ["string", "null"], "format": "date-time"},
                "variants": {"type": "array", "items": {"type": "object"}},
                "failures": {"type": "array", "items": {"$ref": "#/components/schemas/Failure"}},
                "findings": {"type": "array", "items": {"type": "object"}},
            },
        },
        "Template": {
            "type": "object",
            "properties": {
                "sha256": {"type": "string"},
                "size": {"type": "integer"},
                "first_seen": {"type": "string", "format": "date-time"},
                "text": {"type": "string"},
                "url": {"type": "string", "format": "uri"},
                "check": {"oneOf": [{"$ref": "#/components/schemas/Check"}, {"type": "null"}]},
                "models": {"type": "array", "items": {"type": "object"}},
            },
        },
        "Probe": {
            "type": "object",
            "description": "One mlx-lm probe run on the Mac worker (the report itself is shown "
            "on the model page).",
            "properties": {
                "id": {"type": "integer"},
                "repo_id": {"type": "string"},
                "commit_sha": {"type": "string"},
                "state": {"type": "string", "enum": ["queued", "running", "done", "error"]},
                "verdict": {"type": ["string", "null"], "enum": [*PROBE_VERDICTS, None]},
                "reused_share": {"type": ["number", "null"]},
                "disagreement": {"type": "boolean"},
                "error": {"type": ["string", "null"]},
                "worker": {"type": ["string", "null"]},
                "machine": {"type": "object"},
                "queued_at": {"type": "string", "format": "date-time"},
                "started_at": {"type": ["string", "null"], "format": "date-time"},
                "finished_at": {"type": ["string", "null"], "format": "date-time"},
                "page_url": {"type": "string", "format": "uri"},
                "position": {"type": "integer", "description": "In the queue (waiting only)"},
                "seconds": {"type": ["number", "null"], "description": "On the Mac (recent)"},
            },
        },
        "ProbeQueue": {
            "type": "object",
            "properties": {
                "worker": {
                    "type": "object",
                    "properties": {
                        "online": {"type": "boolean"},
                        "detail": {"type": "string"},
                        "since": {"type": ["string", "null"], "format": "date-time"},
                    },
                },
                "queue_size": {"type": "integer"},
                "waiting": {"type": "array", "items": {"$ref": "#/components/schemas/Probe"}},
                "recent": {"type": "array", "items": {"$ref": "#/components/schemas/Probe"}},
            },
        },
        "ModelDetail": {
            "type": "object",
            "description": "Registry fields (status, verdict, current template sha256 and "
            "source file, history of template changes) plus the check and probe results.",
            "properties": {
                "variants": {"type": "array", "items": {"type": "object"}},
                "check": {"oneOf": [{"$ref": "#/components/schemas/Check"}, {"type": "null"}]},
                "probe": {"oneOf": [{"$ref": "#/components/schemas/Probe"}, {"type": "null"}]},
            },
        },
    }
}

PATHS: dict[str, Any] = {
    "/api/models": {
        "get": {
            "summary": "Search and list tracked models",
            "parameters": [
                _param("q", "query", "Words to find in repo id, author, family, tags"),
                _param("verdict", "query", "Template verdict", enum=VERDICTS, type="string"),
                _param(
                    "thinking",
                    "query",
                    "safe_on, safe_off (cache-safe with thinking on/off), none (no switch), "
                    "same or differs (the verdict does / does not depend on it)",
                ),
                _param("hybrid", "query", "yes or no"),
                _param("tools", "query", "safe, unsafe, unsupported or unknown"),
                _param(
                    "probe",
                    "query",
                    "none (never probed) or the latest probe's verdict: hit, partial, miss, wrong",
                ),
                _param("author", "query", "Exact author"),
                _param("sort", "query", "downloads (default), changed or name"),
                _param("page", "query", "Page number, 50 models per page", type="integer"),
            ],
            "responses": _ok("A page of models", "ModelList"),
        }
    },
    "/api/models/{org}/{name}": {
        "get": {
            "summary": "One model: status, verdict, variants, current template, history, probes",
            "parameters": [ORG, NAME],
            "responses": _ok("The model", "ModelDetail"),
        }
    },
    "/api/templates/{sha256}": {
        "get": {
            "summary": "One template version: text, check, models that use it",
            "parameters": [SHA],
            "responses": _ok("The template version", "Template"),
        }
    },
    "/api/checks/{sha256}": {
        "get": {
            "summary": "The newest check of a template version, with every failing pair",
            "parameters": [SHA],
            "responses": _ok("The check", "Check"),
        }
    },
    "/api/probes": {
        "get": {
            "summary": "The Mac probe queue: waiting probes in order, recent ones, the worker",
            "responses": {
                "200": {
                    "description": "The queue",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ProbeQueue"}}
                    },
                }
            },
        }
    },
    "/api/openapi.json": {
        "get": {
            "summary": "This document",
            "responses": {"200": {"description": "OpenAPI 3.1 schema"}},
        }
    },
}


def schema(server_url: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "CacheSafe API",
            "version": "1",
            "description": "Which Hugging Face chat templates keep a prompt cache warm.",
        },
        "servers": [{"url": server_url.rstrip("/")}],
        "paths": PATHS,
        "components": COMPONENTS,
    }
