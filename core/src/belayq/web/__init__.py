"""The dashboard page (``belayq dashboard``, ``belayq demo --web``): live counts and lists of
any queue, lease ages, dead letters with replay, a throughput and recovery chart, and, in
demo mode, a pool of job-queue workers. Needs ``pip install belayq[web]`` (Starlette
and uvicorn); the page itself ships in the package and loads nothing from elsewhere."""

from .app import create_app, serve

__all__ = ["create_app", "serve"]
