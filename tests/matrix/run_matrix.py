"""Run envs of the tox matrix (tox.ini) one after the other and report each one's versions
and pytest summary.

    python -m tests.matrix.run_matrix                 # CI: CI_ENVS with CI_SUBSETS
    python -m tests.matrix.run_matrix --all           # every env of tox.ini with SUBSETS
    python -m tests.matrix.run_matrix --envs kombu53 rq20 [--full]
    python -m tests.matrix.run_matrix --all --quick   # every env with CI_SUBSETS

Each env runs ``uvx --with tox-uv tox -e ENV -- <its tests>``: the envs of one framework run
that framework's tests, the redis-py envs the core's (``--full``: the whole suite). The
Pythons 3.10 to 3.13 are looked for under pyenv (``~/.pyenv/versions``) and on PATH; an env
whose Python is not on this machine is reported as "unverified here", not as a failure.

Writes ``.peer/matrix-results.json`` and exits 0 only when every env that ran passed.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / ".peer" / "matrix-results.json"

#: The oldest and the newest of each framework (kombu/Celery, RQ, Dramatiq, redis-py): what
#: CI runs. The newest Dramatiq, and the newest redis-py on Python 3.11, are the suite's own
#: environment, so they are not repeated.
CI_ENVS = ["kombu53", "kombu57", "rq20", "rq212", "dramatiq117", "py311-redis5"]

#: The tests each kind of env runs (what its factor changes): the adapter's tests with real
#: workers, or the core's with the scripts and the blocking claim.
SUBSETS = {
    "kombu": ["tests/plugins/kombu", "tests/badinput/test_celery_bad_input.py"],
    "rq": ["tests/plugins/rq", "tests/badinput/test_rq_bad_input.py"],
    "dramatiq": ["tests/plugins/dramatiq"],
    "redis": ["tests/lua", "tests/conformance", "tests/core", "tests/security"],
}

#: The smaller subsets CI runs (under a minute each): the tests that read what a version
#: changes (kombu's channel and Celery's worker state on a blip, RQ's job records and
#: registries, redis-py's scripts and the blocking claim's connections).
CI_SUBSETS = {
    "kombu": ["tests/plugins/kombu/test_transport.py", "tests/plugins/kombu/test_celery_worker.py",
              "-k", "not test_celery_worker or blip"],
    "rq": ["tests/plugins/rq/test_queue_worker.py"],
    "dramatiq": ["tests/plugins/dramatiq/test_workers.py"],
    "redis": ["tests/lua/test_scripts.py", "tests/core/test_blocking.py"],
}

#: What each env's interpreter is asked for.
VERSIONS = (
    "import sys, importlib.metadata as m\n"
    "v = {'python': sys.version.split()[0]}\n"
    "for d in ('redis', 'kombu', 'celery', 'rq', 'dramatiq'):\n"
    "    try: v[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: v[d] = None\n"
    "print(__import__('json').dumps(v))\n"
)


def tox_envs() -> list[str]:
    """Every env tox.ini lists (its ``env_list``, braces expanded)."""
    ini = configparser.ConfigParser()
    ini.read(ROOT / "tox.ini")
    out: list[str] = []
    for line in ini["tox"]["env_list"].split():
        parts = [p.split(",") for p in re.split(r"[{}]", line)]
        combos = [""]
        for i, part in enumerate(parts):
            combos = [c + p for c in combos for p in (part if i % 2 else part[:1])]
        out += combos
    return out


def subset(env: str, ci: bool) -> list[str]:
    kind = next((k for k in ("kombu", "rq", "dramatiq") if env.startswith(k)), "redis")
    return (CI_SUBSETS if ci else SUBSETS)[kind]


def pythons_path() -> str:
    """PATH with pyenv's interpreters first, so tox-uv finds python3.10 ... 3.13."""
    found = sorted((Path.home() / ".pyenv" / "versions").glob("3.*/bin"))
    return os.pathsep.join([*map(str, found), os.environ.get("PATH", "")])


def wanted_python(env: str) -> str | None:
    m = re.match(r"py(\d)(\d+)-", env)
    return f"python{m.group(1)}.{m.group(2)}" if m else None


def run_env(env: str, full: bool, ci: bool) -> dict[str, object]:
    path = pythons_path()
    python = wanted_python(env)
    if python and shutil.which(python, path=path) is None:
        return {"env": env, "result": "unverified here", "why": f"no {python} on this machine"}
    tests = ["--ignore=tests/matrix"] if full else subset(env, ci)
    args = ["-q", "-p", "no:cacheprovider", *tests]
    cmd = ["uvx", "--with", "tox-uv", "tox", "-e", env, "--", *args]
    envvars = {**os.environ, "PATH": path, "CI": "true", "BELAYQ_PEER": "0"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=envvars, capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s", out, re.M)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    # what a failing env printed about its failures (its tests' assertions and output), so a
    # run on another machine can be read after its checkout is gone
    report = re.search(r"^=+ (?:FAILURES|ERRORS) =+$(.*?)^=+ short test summary", out, re.M | re.S)
    versions: dict[str, object] = {}
    venv_python = ROOT / ".tox" / env / "bin" / "python"
    if venv_python.exists():
        got = subprocess.run([str(venv_python), "-c", VERSIONS], capture_output=True, text=True)
        if got.returncode == 0:
            versions = json.loads(got.stdout)
    return {
        "env": env,
        "result": "pass" if proc.returncode == 0 else "FAIL",
        "summary": summary[-1] if summary else out[-400:],
        "failed": failed,
        "report": report.group(1)[-6000:] if report and proc.returncode else "",
        "tests": "full suite" if full else " ".join(tests),
        "seconds": round(elapsed),
        **versions,
    }


def table(results: list[dict[str, object]]) -> str:
    rows = ["| env | Python | redis-py | kombu | Celery | rq | Dramatiq | result | tests |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        shown = r.get("summary") or r.get("why", "")
        rows.append(
            f"| {r['env']} | {r.get('python', '-')} | {r.get('redis', '-')} | "
            f"{r.get('kombu', '-')} | {r.get('celery', '-')} | {r.get('rq', '-')} | "
            f"{r.get('dramatiq', '-')} | {r['result']}: {shown} ({r.get('seconds', 0)} s) | "
            f"{r.get('tests', '-')} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--all", action="store_true", help="every env of tox.ini")
    ap.add_argument("--envs", nargs="+", help="these envs")
    ap.add_argument("--full", action="store_true", help="the whole suite in each env")
    ap.add_argument("--quick", action="store_true", help="CI_SUBSETS in each env")
    args = ap.parse_args(argv)
    envs = args.envs or (tox_envs() if args.all else CI_ENVS)
    results = []
    for env in envs:
        print(f"tox -e {env} ...", file=sys.stderr, flush=True)
        results.append(run_env(env, args.full, ci=args.quick or not (args.all or args.envs)))
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2))
    print(table(results))
    return 0 if all(r["result"] != "FAIL" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
