"""`/docs` that works without the internet: Swagger UI's files come from a Python package (swagger-ui-bundle-v2,
in the `http` extra and the image) instead of the CDN FastAPI's page loads them from, which left a blank page on
an offline host. Swagger UI 5 (the package's) reads the OpenAPI 3.1 schema FastAPI writes; ReDoc, CDN-only, is
not served. Without the package /docs falls back to FastAPI's CDN page, with a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, JSONResponse

log = logging.getLogger("handlers.http")
ASSETS = "/docs/assets"
# the files the /docs page loads, and no others: the package also holds Swagger UI's demo page (its own petstore
# URL), other bundles and source maps, none of which an API server should publish (issue 50 item 12)
SERVED = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon-32x32.png": "image/png"}


def add_docs(app: FastAPI) -> None:
    """app must be made with docs_url=None and redoc_url=None."""
    assets: dict[str, str] = {}
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        log.warning("/docs loads Swagger UI from a CDN: install swagger-ui-bundle-v2 to serve it offline")
    else:
        folder = Path(swagger_ui_path)

        @app.get(ASSETS + "/{name}", include_in_schema=False)
        async def asset(name: str):
            if name not in SERVED:
                return JSONResponse({"error": {"message": f"no docs asset {name!r}", "type": "not_found",
                                               "code": 404}}, status_code=404)
            return FileResponse(folder / name, media_type=SERVED[name],
                                headers={"Cache-Control": "public, max-age=86400"})

        assets = {"swagger_js_url": f"{ASSETS}/swagger-ui-bundle.js", "swagger_css_url": f"{ASSETS}/swagger-ui.css",
                  "swagger_favicon_url": f"{ASSETS}/favicon-32x32.png"}
    redirect = app.swagger_ui_oauth2_redirect_url

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} - API",
                                   oauth2_redirect_url=redirect, **assets)

    @app.get(redirect, include_in_schema=False)
    async def oauth2_redirect():
        return get_swagger_ui_oauth2_redirect_html()
