"""Where relative run paths land inside a Ray job (fl_lightning.runtime.paths): against
$FL_LIGHTNING_RUNS, not Ray's temporary package folder; outside a job nothing changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fl_lightning.runtime.paths import (
    in_ray_job,
    ray_package_dir,
    resolve_output_dir,
    resolve_run_path,
    run_dir_message,
    runs_base,
)

REPO = Path(__file__).resolve().parent.parent
RESOLVERS = [resolve_output_dir, resolve_run_path]


def _ray_pkg(tmp_path: Path) -> Path:
    """A folder laid out like the working dir Ray unpacks for a job."""
    session = tmp_path / "ray" / "session_2025-01-01_00-00-00_000000_1"
    pkg = session / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123456789abcdef"
    (pkg / "conf").mkdir(parents=True)
    return pkg


@pytest.fixture
def job(tmp_path, monkeypatch):
    """Inside a job: RAY_JOB_ID set, cwd = Ray's package folder, FL_LIGHTNING_RUNS set."""
    pkg = _ray_pkg(tmp_path)
    base = tmp_path / "persistent_runs"
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.setenv("RAY_JOB_ID", "02000000")
    monkeypatch.setenv("FL_LIGHTNING_RUNS", str(base))
    monkeypatch.chdir(pkg)
    return pkg, base


@pytest.fixture
def outside(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_JOB_ID", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.setenv("FL_LIGHTNING_RUNS", str(tmp_path / "persistent_runs"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- inside a job ----------------------------------------------------------------------------
@pytest.mark.parametrize("resolve", RESOLVERS)
def test_relative_paths_in_a_job_land_under_fl_lightning_runs(job, resolve):
    pkg, base = job
    assert in_ray_job() and ray_package_dir() == pkg
    assert resolve("runs") == base / "runs"
    assert resolve("runs/cmp/fedavg_fmnist_s0_x") == base / "runs" / "cmp" / "fedavg_fmnist_s0_x"
    assert resolve(Path("results")) == base / "results"
    assert resolve("runs").is_absolute() and pkg not in resolve("runs").parents
    assert not base.exists()  # pure: nothing created


def test_a_subfolder_of_the_package_is_still_inside_the_job(job, monkeypatch):
    pkg, base = job
    monkeypatch.chdir(pkg / "conf")  # a job that cd's into its uploaded code
    assert in_ray_job() and ray_package_dir() == pkg
    assert resolve_output_dir("runs") == base / "runs"


@pytest.mark.parametrize("resolve", RESOLVERS)
def test_absolute_paths_in_a_job_are_unchanged(job, tmp_path, resolve):
    assert resolve(str(tmp_path / "shared" / "runs")) == tmp_path / "shared" / "runs"
    assert resolve("/nfs/runs/cmp") == Path("/nfs/runs/cmp")


@pytest.mark.parametrize("resolve", RESOLVERS)
def test_tilde_is_expanded_in_a_job(job, monkeypatch, tmp_path, resolve):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve("~/runs") == tmp_path / "home" / "runs"
    assert resolve("~") == tmp_path / "home"


def test_runs_base_defaults_to_home_and_expands(job, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FL_LIGHTNING_RUNS")
    assert runs_base() == tmp_path / "home" / "fl_lightning_runs"
    assert resolve_output_dir("runs") == tmp_path / "home" / "fl_lightning_runs" / "runs"
    monkeypatch.setenv("FL_LIGHTNING_RUNS", "")  # empty counts as unset
    assert runs_base() == tmp_path / "home" / "fl_lightning_runs"
    monkeypatch.setenv("FL_LIGHTNING_RUNS", "~/elsewhere")
    assert runs_base() == tmp_path / "home" / "elsewhere"
    monkeypatch.setenv("FL_LIGHTNING_RUNS", "relative/runs")  # never the temporary working dir
    assert runs_base() == tmp_path / "home" / "relative" / "runs"


def test_a_path_printed_by_one_job_names_the_same_directory_in_another(tmp_path, monkeypatch):
    """`run` in job A prints a path; `resume`/`compare` in job B (another package folder) gets it."""
    base = tmp_path / "persistent_runs"
    monkeypatch.setenv("FL_LIGHTNING_RUNS", str(base))
    pkg_a = _ray_pkg(tmp_path / "a")
    pkg_b = _ray_pkg(tmp_path / "b")
    monkeypatch.setenv("RAY_JOB_ID", "02000000")
    monkeypatch.chdir(pkg_a)
    run_dir = resolve_output_dir("runs") / "cluster_test" / "fedavg_fmnist_s0_1"
    monkeypatch.setenv("RAY_JOB_ID", "03000000")
    monkeypatch.chdir(pkg_b)
    assert resolve_run_path("runs/cluster_test/fedavg_fmnist_s0_1") == run_dir  # relative, as printed today
    assert resolve_run_path(str(run_dir)) == run_dir  # absolute
    assert resolve_run_path("runs/cluster_test") == run_dir.parent  # compare's folder


def test_the_job_config_variable_of_a_submitted_entrypoint_counts_too(job, monkeypatch):
    """Ray 2.60 gives a submitted job's entrypoint RAY_JOB_CONFIG_JSON_ENV_VAR, not RAY_JOB_ID."""
    pkg, base = job
    monkeypatch.delenv("RAY_JOB_ID")
    config = '{"runtime_env": {"working_dir": "gcs://_ray_pkg_0123456789abcdef.zip"}, "metadata": {}}'
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", config)
    assert in_ray_job() and resolve_output_dir("runs") == base / "runs"


def test_explicit_env_and_cwd_arguments(tmp_path):
    pkg = _ray_pkg(tmp_path)
    env = {"RAY_JOB_ID": "01000000", "FL_LIGHTNING_RUNS": "/srv/runs"}
    assert in_ray_job(env, pkg) and not in_ray_job({}, pkg) and not in_ray_job(env, tmp_path)
    assert in_ray_job({"RAY_JOB_CONFIG_JSON_ENV_VAR": "{}"}, pkg / "conf")
    assert resolve_output_dir("runs", env, pkg) == Path("/srv/runs/runs")
    assert resolve_output_dir("runs", env, tmp_path) == Path("runs")


# --- outside a job -----------------------------------------------------------------------------
@pytest.mark.parametrize("resolve", RESOLVERS)
def test_outside_a_job_nothing_changes(outside, resolve, monkeypatch):
    assert not in_ray_job()
    assert resolve("runs") == Path("runs") and not resolve("runs").is_absolute()
    assert resolve("runs/cmp/x") == Path("runs/cmp/x")
    assert resolve("/abs/runs") == Path("/abs/runs")
    monkeypatch.setenv("HOME", str(outside / "home"))
    assert resolve("~/runs") == outside / "home" / "runs"  # as Path(output_dir).expanduser() did


@pytest.mark.parametrize("resolve", RESOLVERS)
def test_package_folder_without_ray_job_id_is_not_a_job(job, resolve, monkeypatch):
    monkeypatch.delenv("RAY_JOB_ID")
    assert not in_ray_job() and resolve("runs") == Path("runs")
    monkeypatch.setenv("RAY_JOB_ID", "  ")  # blank counts as unset
    assert not in_ray_job()


@pytest.mark.parametrize("resolve", RESOLVERS)
def test_ray_job_id_outside_a_package_folder_keeps_the_working_directory(outside, resolve, monkeypatch):
    """A job variable set but cwd is a folder the user chose (a driver script they started, a job
    without --working-dir, a subprocess of a Ray task): that folder lasts, so it is respected."""
    monkeypatch.setenv("RAY_JOB_ID", "02000000")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert not in_ray_job() and ray_package_dir() is None
    assert resolve("runs") == Path("runs")
    for name in ("_ray_pkg_abc", "working_dir_files/_ray_pkg_abc", "runtime_resources/x/_ray_pkg_abc"):
        look_alike = outside / name  # only Ray's exact layout counts
        look_alike.mkdir(parents=True)
        monkeypatch.chdir(look_alike)
        assert not in_ray_job(), name


def test_removed_working_directory_is_not_a_job(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.setenv("RAY_JOB_ID", "02000000")
    assert not in_ray_job() and resolve_output_dir("runs") == Path("runs")


def test_run_dir_message_names_the_absolute_path_and_the_node(outside):
    msg = run_dir_message("runs/cmp/x")
    assert msg.startswith(f"run dir: {outside / 'runs' / 'cmp' / 'x'} (node ") and msg.endswith(")")
    assert "\n" not in msg


def test_module_imports_no_ray():
    code = "import sys; import fl_lightning.runtime.paths; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout  # fmt: skip
    assert out.strip() == "False"


# --- the cluster side: yamls set FL_LIGHTNING_RUNS, fetch_runs.sh ignores the upload excludes ---
@pytest.mark.parametrize("path", ["ray_cluster.yaml", "cluster/aws.yaml"])
def test_cluster_yamls_set_fl_lightning_runs_next_to_fl_lightning_data(path):
    import yaml

    cfg = yaml.safe_load((REPO / path).read_text())
    env_lines = [c for c in cfg["setup_commands"] if "~/.fl_lightning_env" in c and "FL_LIGHTNING_DATA=" in c]
    assert env_lines and "FL_LIGHTNING_RUNS=$HOME/fl_lightning_runs" in env_lines[0]
    # Ray's processes (and so every job) read that file before `ray start`, on head and workers
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert any(". ~/.fl_lightning_env" in c and "ray start" in c for c in cfg[key]), key


def _fake_ray(tmp_path: Path, remote: str) -> tuple[Path, Path]:
    """A stand-in `ray` that logs its calls; `exec` answers like the head, `rsync-down` copies a
    fake run (and records whether the yaml it was given still had the upload excludes)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.jsonl"
    (bindir / "python").symlink_to(sys.executable)  # fetch_runs.sh uses the python next to ray
    (bindir / "ray").write_text(f"""#!{sys.executable}
import json, os, sys, yaml
from pathlib import Path
args = sys.argv[1:]
rec = {{"args": args, "tmpdir": os.environ.get("TMPDIR"), "ray_tmpdir": os.environ.get("RAY_TMPDIR")}}
if args[0] in ("exec", "rsync-down"):
    cfg = yaml.safe_load(open([a for a in args if a.endswith(".yaml")][0]))
    rec["rsync_exclude"] = cfg.get("rsync_exclude")
    rec["rsync_filter"] = cfg.get("rsync_filter")
    rec["cluster_name"] = cfg.get("cluster_name")
with open({str(calls)!r}, "a") as f:
    f.write(json.dumps(rec) + "\\n")
if args[0] == "exec":
    print("Fetched IP: 127.0.0.1")
    script = args[-1]
    print({remote!r} if "FL_FETCH_SRC" in script else "?")
    print("Shared connection to 127.0.0.1 closed.")
elif args[0] == "rsync-down":
    target = Path(args[-1])
    run = target / "fedavg_fmnist_s0_x"
    (run / "wandb").mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text("{{}}")
""")
    (bindir / "ray").chmod(0o755)
    return bindir / "ray", calls


def test_fetch_runs_copies_from_the_heads_fl_lightning_runs_without_the_upload_excludes(tmp_path):
    import json

    ray, calls = _fake_ray(tmp_path, "FL_FETCH_SRC=/home/u/fl_lightning_runs/runs/cmp")
    here = tmp_path / "here"
    here.mkdir()
    env = {**os.environ, "RAY": str(ray), "TMPDIR": str(tmp_path)}
    env.pop("RAY_TMPDIR", None)
    res = subprocess.run([str(REPO / "cluster" / "fetch_runs.sh"), str(REPO / "ray_cluster.yaml"), "cmp"],
                         cwd=here, env=env, capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    recs = [json.loads(x) for x in calls.read_text().splitlines()]
    assert [r["args"][0] for r in recs] == ["exec", "rsync-down"]
    for r in recs:  # a copy of the yaml: same cluster, no upload excludes (they would drop runs/ and wandb/)
        assert r["cluster_name"] == "fl-lightning"
        assert r["rsync_exclude"] is None and r["rsync_filter"] is None
        assert r["ray_tmpdir"] == str(tmp_path)  # Ray finds the cluster's state where `ray up` left it
        assert r["tmpdir"] != str(tmp_path) and r["tmpdir"].startswith(str(tmp_path))  # config cache: private
    assert "--no-config-cache" in recs[0]["args"]
    assert "FL_LIGHTNING_RUNS" in recs[0]["args"][-1] and "fl_lightning_env" in recs[0]["args"][-1]
    assert recs[1]["args"][-2:] == ["/home/u/fl_lightning_runs/runs/cmp/", "runs/cmp/"]
    assert (here / "runs" / "cmp" / "fedavg_fmnist_s0_x" / "wandb").is_dir()
    assert "1 finished or stopped runs" in res.stdout
    assert not list(tmp_path.glob("fl_fetch.*"))  # its scratch folder is gone


def test_fetch_runs_says_in_one_line_when_the_head_has_no_runs(tmp_path):
    ray, _ = _fake_ray(tmp_path, "FL_FETCH_MISSING=/home/u/fl_lightning_runs/runs/nope")
    env = {**os.environ, "RAY": str(ray)}
    res = subprocess.run([str(REPO / "cluster" / "fetch_runs.sh"), str(REPO / "ray_cluster.yaml"), "nope"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 1
    missing = "/home/u/fl_lightning_runs/runs/nope"
    assert res.stderr.strip() == f"fetch_runs: error: no runs on the head at {missing}"
    assert not (tmp_path / "runs").exists()


def test_cluster_scripts_parse_and_are_executable():
    assert subprocess.run(["bash", "-n", str(REPO / "cluster" / "selftest.sh")]).returncode == 0
    for name in ("selftest.sh", "fetch_runs.sh", "submit.sh"):
        assert os.access(REPO / "cluster" / name, os.X_OK), name
