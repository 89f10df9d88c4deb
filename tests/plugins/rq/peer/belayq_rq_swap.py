"""Swap belayq_rq's classes into RQ, so RQ's own test suite runs on them.

Loaded as a pytest plugin (``-p belayq_rq_swap``) before RQ's test modules are collected,
and by ``sitecustomize`` in every subprocess the suite starts (``rqworker``, ``rq``), when
``BELAYQ_RQ_SWAP=1``. Every module attribute, class attribute and function default of the
``rq`` package that is RQ's stock ``Queue``, ``Worker``, ``SimpleWorker`` or
``HerokuWorker`` becomes the belayq_rq class of the same name. Classes that belayq_rq does
not provide (SpawnWorker, RoundRobinWorker, RandomWorker) stay stock: they subclass the
stock Worker, so with belayq queues they refuse to start (by design).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import sys
import types
from typing import Any

SWAPPED = False


def swap() -> None:
    global SWAPPED
    if SWAPPED:
        return
    import rq
    import rq.queue
    import rq.worker

    import belayq_rq

    for info in pkgutil.walk_packages(rq.__path__, "rq."):
        if info.name.startswith("rq.contrib"):
            continue
        with contextlib.suppress(Exception):  # optional dependencies of some modules
            importlib.import_module(info.name)
    table: dict[int, Any] = {
        id(rq.queue.Queue): belayq_rq.Queue,
        id(rq.worker.Worker): belayq_rq.Worker,
        id(rq.worker.SimpleWorker): belayq_rq.SimpleWorker,
        id(rq.worker.HerokuWorker): belayq_rq.HerokuWorker,
    }
    ours = {id(c) for c in table.values()}

    def fix(value: Any) -> Any:
        return table.get(id(value), value)

    for name, module in list(sys.modules.items()):
        if not (name == "rq" or name.startswith("rq.")) or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in table:
                setattr(module, attr, table[id(value)])
            elif (
                isinstance(value, type)
                and value.__module__.startswith("rq")
                and id(value) not in ours
            ):
                for cattr in ("queue_class", "worker_class"):
                    if id(value.__dict__.get(cattr)) in table:
                        setattr(value, cattr, fix(value.__dict__[cattr]))
                for member in list(vars(value).values()):
                    _fix_defaults(member, fix)
            _fix_defaults(value, fix)
    SWAPPED = True


def _fix_defaults(obj: Any, fix: Any) -> None:
    func = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
    if not isinstance(func, types.FunctionType):
        return
    if func.__defaults__:
        func.__defaults__ = tuple(fix(v) for v in func.__defaults__)
    if func.__kwdefaults__:
        func.__kwdefaults__ = {k: fix(v) for k, v in func.__kwdefaults__.items()}


swap()
