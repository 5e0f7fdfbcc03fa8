"""Serving: the app factory (app), uvicorn's configuration (server) and the embedded server
the demo and tests start in-process.
"""
