"""The local HTTP server (FastAPI + uvicorn)."""
