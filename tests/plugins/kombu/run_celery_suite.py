"""Celery's own integration suite against belayq:// and against redis://, side by side.

Slow (tens of minutes), so it is a separate command, not part of the default pytest run::

    .venv/bin/python tests/plugins/kombu/run_celery_suite.py [--files test_tasks.py ...]
        [--brokers belayq,redis] [-- extra pytest args]

What it does:

1. downloads the sdist of the *installed* Celery from PyPI into ``.peer/`` (never
   committed) and copies its ``t/`` tests into ``.peer/celery-suite/``;
2. builds a venv for it in ``.peer/celery-suite-venv`` (uv): this workspace's belayq and
   belayq-kombu (editable), the installed versions of celery, kombu and redis-py, and the
   suite's own test dependencies (pytest-rerunfailures, pytest-timeout, pydantic ...);
3. starts a throwaway redis-server on a free port (never 6379);
4. runs ``t/integration/{test_tasks,test_inspect,test_canvas}.py`` three ways (pick with
   ``--brokers``): ``belayq`` = ``TEST_BROKER=belayq://...`` (belayq_kombu loaded as a
   pytest plugin so the scheme is registered in the process that runs Celery's in-process
   test worker); ``belayq-class`` = ``TEST_BROKER=redis://...`` with
   ``broker_transport = "belayq_kombu:Transport"`` (the suite's own
   ``integration-tests-config.json`` hook), so the tests that decide by the URL's scheme
   treat it as the Redis broker it emulates; ``redis`` = the stock transport. The result
   backend is Redis (db 1) in every run;
5. prints both summaries and exits 1 if the belayq run has a failure the redis run
   does not have.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peer import PEER, ROOT, sdist  # noqa: E402

FILES = ["test_tasks.py", "test_inspect.py", "test_canvas.py"]
TEST_DEPS = ["pytest", "pytest-timeout", "pytest-rerunfailures", "pytest-subtests", "pydantic"]


def venv(python: str) -> Path:
    import celery
    import kombu
    import redis

    target = PEER / "celery-suite-venv"
    exe = target / "bin" / "python"
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv is needed to build the suite's venv (pip install uv)")
    if not exe.exists():
        subprocess.run([uv, "venv", "--python", python, str(target)], check=True)
    subprocess.run(
        [uv, "pip", "install", "--python", str(exe), "-q", "-e", str(ROOT / "core"),
         "-e", str(ROOT / "plugins" / "kombu"), f"celery=={celery.__version__}",
         f"kombu[redis]=={kombu.__version__}", f"redis=={redis.__version__}", *TEST_DEPS],
        check=True,
    )
    return exe


def suite_dir() -> Path:
    import celery

    source = sdist("celery", celery.__version__)
    target = PEER / "celery-suite"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    shutil.copytree(source / "t", target / "t")
    shutil.copy(source / "pyproject.toml", target / "pyproject.toml")  # its pytest settings
    return target


def run(exe: Path, where: Path, broker: str, backend: str, port: int, files: list[str],
        extra: list[str]) -> tuple[str, int]:
    env = dict(os.environ, TEST_BROKER=broker, TEST_BACKEND=backend, REDIS_HOST="127.0.0.1",
               REDIS_PORT=str(port), PATH=f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    cmd = [str(exe), "-m", "pytest", "-p", "no:cacheprovider", "-p", "celery.contrib.pytest",
           "-p", "belayq_kombu",
           *[f"t/integration/{f}" for f in files], "-q", "-rfE", "--timeout=300", *extra]
    print(f"\n$ TEST_BROKER={broker} {' '.join(cmd[1:])}", flush=True)
    out = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True)
    keep = [line for line in out.stdout.splitlines()
            if re.match(r"(FAILED|ERROR|SUBFAILED|XPASS|\d+ (passed|failed))", line)]
    print("\n".join(keep), flush=True)
    log = PEER / f"celery-suite-{broker.split(':')[0]}-{len(os.listdir(PEER))}.log"
    log.write_text(out.stdout + out.stderr)
    print(f"(full output: {log})", flush=True)
    return out.stdout, out.returncode


def failures(output: str) -> set[str]:
    return set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--files", nargs="*", default=FILES)
    ap.add_argument("--brokers", default="belayq,belayq-class,redis")
    ap.add_argument("extra", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    from belayq.embedded import RedisServer

    exe = venv(sys.executable)
    where = suite_dir()
    results: dict[str, str] = {}
    with RedisServer() as server:
        for mode in args.brokers.split(","):
            scheme = "belayq" if mode == "belayq" else "redis"
            broker = f"{scheme}://127.0.0.1:{server.port}/0"
            overrides = where / "integration-tests-config.json"
            overrides.unlink(missing_ok=True)
            if mode == "belayq-class":
                overrides.write_text('{"broker_transport": "belayq_kombu:Transport"}')
            output, _ = run(exe, where, broker, f"redis://127.0.0.1:{server.port}/1",
                            server.port, args.files, args.extra)
            overrides.unlink(missing_ok=True)
            results[mode] = output
    print("\n== summary ==")
    for mode, output in results.items():
        lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
        print(f"{mode:13} {lines[-1] if lines else '(no summary line)'}")
    status = 0
    for mode in ("belayq", "belayq-class"):
        if mode in results and "redis" in results:
            only = failures(results[mode]) - failures(results["redis"])
            print(f"failing with {mode} only: {sorted(only) or 'none'}")
            status |= bool(only)
    return status


if __name__ == "__main__":
    sys.exit(main())
