"""The dashboard (``belayq dashboard``, ``belayq demo --web``): the console of a fleet's
queues, every kind in one sortable overview, a queue's counts, per-minute history and lists,
a message's detail (a Celery task's fields, RQ's job record), search by id, and actions
confirmed before they are sent (replay, delete, requeue, purge, sweep); in demo mode, a
pool of job-queue workers. Needs ``pip install belayq[web]`` (Starlette and uvicorn); the
page itself ships in the package and loads nothing from elsewhere."""

from .app import create_app, serve

__all__ = ["create_app", "serve"]
