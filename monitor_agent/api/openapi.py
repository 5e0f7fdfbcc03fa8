"""The OpenAPI description of the raw-body record routes, which FastAPI cannot infer (their
handlers read the request's bytes, not a model)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from monitor_agent.records import schemas


def install_openapi(app: FastAPI) -> None:
    """Describe the raw-body ingest endpoints in OpenAPI (FastAPI cannot infer it)."""
    adapter = TypeAdapter(list[schemas.RecordModel])

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                          summary=app.summary)
        items = adapter.json_schema(ref_template="#/components/schemas/{model}")
        defs = items.pop("$defs", {})
        doc.setdefault("components", {}).setdefault("schemas", {}).update(defs)
        envelope = {"type": "object", "required": ["records"], "properties": {"records": items}}
        for path in ("/v1/records", "/v1/records/preview"):  # the same bodies
            if path in doc["paths"]:
                doc["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {
                        "application/json": {"schema": envelope},
                        "application/x-ndjson": {"schema": {"type": "string"}},
                    },
                }
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
