"""What the two uvicorn adapters (HTTP and SageMaker's `serve`) put around their app, as plain ASGI and asyncio
so that the core needs no web framework: the API key and cross-site checks, the request body limits, the deadlines
of a connection before the app sees it, the check before listening, HEAD as GET, and the draining shutdown."""
