"""The ``belayq`` command line: every command, its one-line summary, its help with an
example, and the exit status it gives (see :data:`EXIT_STATUS`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..discovery import KNOWN_KINDS

#: The exit status every command gives.
DONE, NOTHING, ERROR, INTERRUPTED = 0, 1, 2, 130

EXIT_STATUS = """\
exit status:
  0    done: shown (an empty listing too), or acted on (a purge of an empty queue too)
  1    nothing matched, nothing done: replay of an id that is not a dead letter or of
       a --reason no dead letter holds; a purge or drop not confirmed
  2    error, nothing changed: bad arguments, no such queue, a server that cannot be
       reached or refuses, a drop while messages are claimed (one line on stderr; a
       password is never shown)
  130  interrupted (Ctrl-C)"""

#: The exit status of each kind of command, in its own help.
_ERROR = ("  2    error, nothing changed: bad arguments, no such queue, a server that cannot\n"
          "       be reached or refuses (one line on stderr; a password is never shown)\n")
_DROP_ERROR = ("  2    error, nothing deleted: messages of QUEUE are claimed, bad arguments, no\n"
               "       such queue, a server that cannot be reached or refuses (one line on\n"
               "       stderr; a password is never shown)\n")
_SHOWN = "  0    shown (an empty listing too)\n" + _ERROR
_SERVED = ("  2    error: bad arguments, no such queue, a server that cannot be reached or\n"
           "       refuses, a port this process cannot listen on\n"
           "  130  ended with Ctrl-C (it serves until then; SIGTERM ends it as that signal\n"
           "       does, 143 in a shell)\n")
_EXITS = {
    "replay": ("  0    every dead letter asked for was replayed (--all of none too)\n"
               "  1    an --id is not a dead letter of QUEUE (the others were replayed), or\n"
               "       no dead letter's reason holds --reason: nothing replayed\n" + _ERROR),
    "purge": ("  0    purged (also when nothing was waiting)\n"
              "  1    not confirmed: nothing deleted\n" + _ERROR),
    "drop": "  0    dropped\n  1    not confirmed: nothing deleted\n" + _DROP_ERROR,
    "upgrade": "  0    upgraded, or already at schema 2\n" + _ERROR,
    "exporter": _SERVED, "dashboard": _SERVED, "demo": _SERVED,
}

DESCRIPTION = """\
See and steer reliable queues on a Redis server: belayq's own, and the Celery
(belayq://), RQ (belayq_rq) and Dramatiq (belayq_dramatiq) queues belayq runs."""

EPILOG = f"""\
Start with:
  belayq queues --url redis://localhost:6379/0
  belayq stats --url redis://localhost:6379/0 QUEUE

`belayq COMMAND --help` tells more about each command. A queue is one a belayq process
has opened (belayq's registry: belayq's own, Celery's and Dramatiq's queues), one RQ knows
(rq:queues), or one Celery's bindings name; nothing is found by scanning the keyspace, and
no other key is taken for a queue. Every command acts on a queue with its recorded
settings.

{EXIT_STATUS}"""

#: Whose queues each kind names (``--kind``).
KIND_OWNERS = {"belayq": "belayq's own", "kombu": "Celery's", "rq": "RQ's",
               "dramatiq": "Dramatiq's"}

URL_HELP = ("the Redis server: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss:// (TLS), "
            "unix:///path/to/socket[?db=N], or Celery's belayq:// and belayqs://")

#: Each command: its one-line summary (``belayq --help``), what its help adds, and its
#: examples.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "queues": (
        "list the queues on the server, with their sizes and counters",
        "Columns: ready (waiting to be claimed), in_flight (claimed, under a lease), delayed\n"
        "(waiting for their due time), dead (dead letters), and the counters acked,\n"
        "reclaimed (claims whose lease ran out: their consumer died or hung) and\n"
        "dead_lettered. With --json: one object per queue, with `recorded` (whether a belayq\n"
        "process recorded its settings).",
        "belayq queues --url redis://localhost:6379/0\n"
        "belayq queues --url redis://localhost:6379/0 --kind rq --json",
    ),
    "stats": (
        "show one queue's sizes, counters and recorded settings",
        "Sizes (ready, in_flight, landing: claimed a moment ago and not yet under a lease,\n"
        "delayed, dead), ready messages by priority, every counter since the queue was\n"
        "made, and the settings its processes recorded: lease, runs before the dead-letter\n"
        "set, the dead-letter cap, what happens to a message out of runs, the history and\n"
        "the events.",
        "belayq stats --url redis://localhost:6379/0 emails",
    ),
    "inspect": (
        "list the claimed messages: lease time left, deliveries, runs",
        "The messages consumers hold now, the soonest to lose its lease first: the lease\n"
        "time left (s), deliveries, runs (attempts), whether the consumer started it, the\n"
        "consumer that holds it (held_by: host:pid), and what the payload says (a Celery\n"
        "task's name and id, else its first bytes).",
        "belayq inspect --url redis://localhost:6379/0 emails --limit 20",
    ),
    "delayed": (
        "list the delayed messages, soonest due first",
        "Messages waiting for their due time (countdowns, ETAs, retry backoffs; an RQ\n"
        "queue's scheduled jobs too), with the time left (s).",
        "belayq delayed --url redis://localhost:6379/0 emails",
    ),
    "dead": (
        "list the dead letters, newest first, with their reasons",
        "Messages that ran out of runs (max_deliveries) or could not be read, with the\n"
        "reason, deliveries, runs and when they died. `belayq replay` puts them back.",
        "belayq dead --url redis://localhost:6379/0 emails --limit 10",
    ),
    "history": (
        "list the last finished messages (a queue that keeps a history)",
        "The last messages acked (with the result the consumer gave), or with --failed the\n"
        "last dead-lettered (with the reason), or with --control the last pauses and\n"
        "resumes (who and when), newest first. Only a queue whose consumers keep a history\n"
        "(history_max) has one; the command says when it is off.",
        "belayq history --url redis://localhost:6379/0 emails\n"
        "belayq history --url redis://localhost:6379/0 emails --failed\n"
        "belayq history --url redis://localhost:6379/0 emails --control",
    ),
    "replay": (
        "put dead letters back on the ready list with fresh counts",
        "Replays the dead letters named by --id, those whose reason holds --reason, or\n"
        "--all of them. Each goes to the back of its priority level's ready list, its\n"
        "delivery and run counts reset. An --id that is not a dead letter of the queue is\n"
        "named on stderr and gives exit status 1 (the others are replayed).",
        "belayq replay --url redis://localhost:6379/0 emails --id 01a2... --id 01a3...\n"
        "belayq replay --url redis://localhost:6379/0 emails --reason TimeoutError\n"
        "belayq replay --url redis://localhost:6379/0 emails --all",
    ),
    "purge": (
        "delete a queue's waiting messages (claims and dead letters stay)",
        "Deletes the ready messages, and with --delayed the delayed ones too. Messages\n"
        "consumers hold and dead letters stay. An RQ queue's job hashes go with their jobs,\n"
        "as `rq empty` does (this needs belayq-rq). Asks for the queue's name first, unless\n"
        "--yes. A queue with nothing waiting is purged at once (exit status 0).",
        "belayq purge --url redis://localhost:6379/0 emails\n"
        "belayq purge --url redis://localhost:6379/0 emails --delayed --yes",
    ),
    "drop": (
        "delete a queue and every key of its own (refused while messages are claimed)",
        "Deletes the queue's waiting and delayed messages, dead letters, history, counters\n"
        "and its record. Refused, deleting nothing (exit status 2), while any message is\n"
        "claimed: shut its consumers down first. Asks for the queue's name first, unless\n"
        "--yes.",
        "belayq drop --url redis://localhost:6379/0 old-emails --yes",
    ),
    "pause": (
        "pause a queue's claims: its consumers are handed nothing until resumed",
        "From now on no consumer of QUEUE is handed a message, whatever its framework (Celery,\n"
        "RQ, belayq's own) and however it claims. Publishing goes on, and the messages held\n"
        "now stay held: their consumers extend, ack and retry them as usual, and a lease that\n"
        "runs out puts its message back in the ready list, where it waits. `belayq stats`\n"
        "shows `paused`; the queue's history (history_max) records who paused it and when.\n"
        "A queue paused already is left as it is (exit status 0).",
        "belayq pause --url redis://localhost:6379/0 emails\n"
        "belayq pause --url redis://localhost:6379/0 celery --kind kombu",
    ),
    "resume": (
        "resume a queue's claims that `belayq pause` paused",
        "Consumers waiting on QUEUE wake at once and claim what is waiting, blocked ones\n"
        "included. A queue that is not paused is left as it is (exit status 0).",
        "belayq resume --url redis://localhost:6379/0 emails",
    ),
    "watch": (
        "show the queue table again every few seconds",
        "The table of `belayq queues`, refreshed every --interval seconds until Ctrl-C (or\n"
        "--count views). With --json: one object per refresh, with its time and queues.",
        "belayq watch --url redis://localhost:6379/0\n"
        "belayq watch --url redis://localhost:6379/0 emails reports --interval 5",
    ),
    "exporter": (
        "serve Prometheus metrics of the queues",
        "Serves http://HOST:PORT/metrics: every queue's sizes and counters, its ready\n"
        "messages by priority and the age of its oldest ready message and lease, labelled\n"
        "with the queue and its kind. Each scrape reads O(queues). Needs belayq[metrics].",
        "belayq exporter --url redis://localhost:6379/0 --port 9808",
    ),
    "dashboard": (
        "serve the web dashboard of the queues",
        "A page of the queues, what each holds (ready, claimed, delayed, dead, finished)\n"
        "and their counters. Listens on 127.0.0.1 unless --host; another address needs a\n"
        "--token, asked of every request. Needs belayq[web].",
        "belayq dashboard --url redis://localhost:6379/0\n"
        "belayq dashboard --url redis://localhost:6379/0 --host 0.0.0.0 --token SECRET",
    ),
    "demo": (
        "serve the web demo: a queue and a pool of workers to kill and watch",
        "A page where you publish jobs, kill or hang workers, and watch their jobs come\n"
        "back after the lease (--visibility-ms). Uses an embedded Redis unless --url or\n"
        "--redis-host/--redis-port name one. Needs belayq[web].",
        "belayq demo --web\n"
        "belayq demo --web --url redis://localhost:6379/0 --visibility-ms 2000",
    ),
    "upgrade": (
        "rewrite a queue written with key schema 1 as schema 2",
        "For a queue a belayq with key schema 1 wrote. Shut its old consumers down first:\n"
        "their claims go back to the head of their ready lists. Resumable: run it again\n"
        "after an interruption. A queue already at schema 2 is left as it is (exit\n"
        "status 0). QUEUE's kind is belayq unless --kind says kombu or rq.",
        "belayq upgrade --url redis://localhost:6379/0 emails\n"
        "belayq upgrade --url redis://localhost:6379/0 celery --kind kombu",
    ),
}  # fmt: skip

#: Commands that act on one queue, named as an argument.
ONE_QUEUE = ("stats", "inspect", "delayed", "dead", "history", "replay", "purge", "drop",
             "pause", "resume", "upgrade")
#: Commands that take any number of queues (none: every queue found).
MANY_QUEUES = ("watch", "exporter", "dashboard")


def positive_int(text: str) -> int:
    """An argument that must be an int >= 1."""
    return _int_at_least(text, 1)


def count_arg(text: str) -> int:
    """An argument that must be an int >= 0."""
    return _int_at_least(text, 0)


def lease_arg(text: str) -> int:
    """A lease in ms: at least 100 (the queues' floor)."""
    return _int_at_least(text, 100)


def port_arg(text: str) -> int:
    """A TCP port: 1..65535."""
    port = _int_at_least(text, 1)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, got {text}")
    return port


def seconds_arg(text: str) -> float:
    """A period in seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"want a number of seconds, 0 or more, got {text}")
    return value


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"want a whole number >= {minimum}, got {value}")
    return value


def build() -> argparse.ArgumentParser:
    """The ``belayq`` parser."""
    parser = argparse.ArgumentParser(
        prog="belayq", description=DESCRIPTION, epilog=EPILOG, formatter_class=_Formatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (summary, more, examples) in COMMANDS.items():
        lines = examples.splitlines()
        shown = "".join(f"  {line}\n" for line in lines)
        exits = _EXITS.get(name, _SHOWN)
        p = sub.add_parser(
            name, help=summary, description=f"{summary[0].upper()}{summary[1:]}.\n\n{more}",
            epilog=f"{'examples' if len(lines) > 1 else 'example'}:\n{shown}\n"
                   f"exit status:\n{exits}",
            formatter_class=_Formatter)
        _add_arguments(name, p)
    return parser


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help as written (line breaks kept), 88 columns, every command's summary on its line."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=28, width=88)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):  # the commands, indented twice
            longest = max(len(name) for name in action.choices)
            self._action_max_length = max(self._action_max_length,
                                          longest + self._current_indent + 4)


def _add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "demo":
        _demo_arguments(p)
        return
    p.add_argument("--url", required=True, help=URL_HELP)
    if name in ONE_QUEUE:
        p.add_argument("queue", metavar="QUEUE", help="the queue's name (`belayq queues` "
                       "lists them)")
    if name in MANY_QUEUES:
        p.add_argument("queue", metavar="QUEUE", nargs="*",
                       help="the queues to show (default: every queue found)")
    kinds = ", ".join(f"{kind} ({KIND_OWNERS[kind]})" for kind in KNOWN_KINDS[:-1])
    kinds += f" or {KNOWN_KINDS[-1]} ({KIND_OWNERS[KNOWN_KINDS[-1]]})"
    p.add_argument("--kind", choices=("auto", *KNOWN_KINDS), default="auto", help=(
        f"the kind of queue QUEUE is, {kinds}: needed when queues of several kinds have that "
        "name (default auto)" if name in ONE_QUEUE else
        f"only queues of this kind, {kinds} (default auto: any)"))
    p.add_argument("--prefix", default="belayq", help="the key prefix of belayq's own queues "
                   "and of its registry (the queues' prefix setting; default %(default)s)")
    if name in ONE_QUEUE or name in ("queues", "watch", "exporter"):
        what = "QUEUE" if name in ONE_QUEUE else "the queues"
        p.add_argument("--namespace", default=None, metavar="NS", help=(
            f"the namespace of {what} when apps share the server: Dramatiq's namespace, or "
            "the key prefix of Celery queues belayq has no record of ('' is the framework's "
            "default; default: any). A Celery app with global_keyprefix P records its "
            "queues under it: reach them with --prefix Pbelayq"))
    if name not in ("exporter", "dashboard"):
        p.add_argument("--json", action="store_true",
                       help="print JSON, one object per line, instead of a table")
    if name in ("inspect", "delayed", "dead", "history"):
        p.add_argument("--limit", type=positive_int, default=50, metavar="N",
                       help="show at most N messages (default %(default)s)")
    extra = _EXTRA.get(name)
    if extra is not None:
        extra(p)


def _history(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--failed", action="store_true",
                       help="the last dead-lettered messages, with their reasons, rather than "
                       "the last acked")
    which.add_argument("--control", action="store_true",
                       help="the last pauses and resumes: who and when")


def _replay(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--all", action="store_true", help="every dead letter, oldest first")
    what.add_argument("--id", action="append", metavar="ID",
                      help="a dead letter's id, as `belayq dead` shows it (repeatable)")
    what.add_argument("--reason", metavar="TEXT",
                      help="the dead letters whose reason holds TEXT")


def _purge(p: argparse.ArgumentParser) -> None:
    _yes(p)
    p.add_argument("--delayed", action="store_true", help="delete the delayed messages too "
                   "(countdowns, ETAs, retry backoffs; RQ's scheduled jobs): kept by default, "
                   "as a running stock fleet keeps them")


def _yes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--yes", action="store_true",
                   help="do not ask for the queue's name (needed without a terminal)")


def _watch(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=seconds_arg, default=1.0, metavar="SECONDS",
                   help="time between two views (default %(default)s)")
    p.add_argument("--count", type=count_arg, default=0, metavar="N",
                   help="end after N views (default 0: run until Ctrl-C)")


def _exporter(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default %(default)s)")
    p.add_argument("--port", type=port_arg, default=9808,
                   help="the port to listen on (default %(default)s)")


def _dashboard(p: argparse.ArgumentParser, port: int = 8790) -> None:
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default "
                   "%(default)s); another address needs --token")
    p.add_argument("--port", type=port_arg, default=port,
                   help="the port to listen on (default %(default)s)")
    p.add_argument("--token", default=os.environ.get("BELAYQ_TOKEN"),
                   help="a secret every API request must carry (Authorization: Bearer TOKEN; "
                   "default: $BELAYQ_TOKEN)")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web", action="store_true", required=True,
                   help="serve the demo page (the terminal demo is examples/demo.py)")
    p.add_argument("--url", help="the Redis server to use (default: an embedded Redis started "
                   "for the demo): " + URL_HELP)
    p.add_argument("--redis-host", metavar="HOST",
                   help="the Redis server's host (with --redis-port: redis://HOST:PORT/0)")
    p.add_argument("--redis-port", type=port_arg, metavar="PORT",
                   help="the Redis server's port (default 6379 with --redis-host)")
    p.add_argument("--visibility-ms", type=lease_arg, default=5000, metavar="MS",
                   help="the lease: how long a killed worker's job waits before it runs "
                   "again (ms, at least 100; default %(default)s)")
    p.add_argument("--queue", default="demo-jobs", metavar="NAME",
                   help="the demo's queue (default %(default)s)")
    _dashboard(p, port=8793)


_EXTRA: dict[str, Any] = {
    "history": _history, "replay": _replay, "purge": _purge, "drop": _yes,
    "watch": _watch, "exporter": _exporter, "dashboard": _dashboard,
}
