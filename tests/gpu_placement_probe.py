"""Run by tests/test_cluster.py in a subprocess: a private local Ray on loopback that
declares fake GPUs, and the real placement + RayExecutor code creating the client actors
(CUDA check off, nothing fitted). Prints one JSON line per case:

    {"case": [...], "gpu_ids": [[...] per actor], "bundles": [...], "clients": [[...] per actor]}
    {"case": [...], "error": "<the ConfigError message>"}

usage: python tests/gpu_placement_probe.py <num_gpus> '<json list of cases>'
a case is [num_clients, gpus_per_client, placement] or ["busy", num_clients, timeout_s]
(all GPUs but one held by another placement group, then ask for one GPU per client) or
["chain", num_clients, gpus_per_client, placement, other_num_clients, other_gpus_per_client]:
one session's workers (`WorkerSource`) over three runs: workers and their placement group made
as `Session.early_start` makes them (`WorkerSource.make`), a run that takes them, a second run
of the same layout that gets them warm (`reuse_actors`, a sequential sweep), then a run of
another layout, which ends them and makes its own; one line with each run's workers, GPUs and
bundles and the placement groups left after the source is cleared. One chain of n + other
workers covers what three cases of their own did: each worker costs ~7 CPU-seconds.
"""

from __future__ import annotations

import dataclasses
import json
import sys


def main() -> None:
    num_gpus, cases = int(sys.argv[1]), json.loads(sys.argv[2])
    from fl_lightning.runtime.local_ray import init_ray

    init_ray(None, num_cpus=2, num_gpus=num_gpus)
    import ray

    from fl_lightning.config import compose
    from fl_lightning.core.errors import ConfigError
    from fl_lightning.runtime.build import prepare
    from fl_lightning.runtime.placement import placement_for
    from fl_lightning.runtime.ray_executor import RayExecutor
    from fl_lightning.runtime.workers import WorkerSource

    def placed(cfg):  # as `Session.placement` decides it, with the CUDA check off (declared GPUs)
        res = ray.cluster_resources()
        return dataclasses.replace(
            placement_for(cfg, res.get("CPU", 0.0), res.get("GPU", 0.0)), check_cuda=False
        )

    def executor(n, gpus, where="auto", timeout=60, source=None):
        cfg = compose([
            "data=digits", "runtime=gpu", f"fl.num_clients={n}", f"runtime.gpus_per_client={gpus}",
            f"runtime.placement={where}", f"runtime.schedule_timeout_s={timeout}", "logger=none",
        ])  # fmt: skip
        placement = placed(cfg)
        p = prepare(cfg, placement=placement)  # as `early_start`'s placement reaches `prepare`
        ex = RayExecutor(p.spec, p.dataset, p.split.train, p.split.test, placement, 0, source=source)
        return ex, placement

    def left() -> int:
        from ray.util import placement_group_table

        return len([t for t in placement_group_table().values() if t["state"] != "REMOVED"])

    def run_line(ex, placement, infos) -> dict:
        return {
            "gpu_ids": [i["gpu_ids"] for i in infos], "clients": [i["clients"] for i in infos],
            "bundles": [placement.bundle_of(a) for a in range(placement.num_actors)],
            "pids": [i["pid"] for i in infos], "reused": ex.reused, "prestarted": ex.prestarted,
        }  # fmt: skip

    for case in cases:
        if case[0] == "chain":  # early workers taken, kept warm for a second run, ended by a third
            _, n, gpus, where, other_n, other_gpus = case
            source = WorkerSource()
            source.make(placed(compose([
                "data=digits", "runtime=gpu", f"fl.num_clients={n}", f"runtime.gpus_per_client={gpus}",
                f"runtime.placement={where}",
            ])))  # fmt: skip
            (idle,) = source._idle.values()
            made_actors, made_pg = [a._actor_id for a in idle.actors], idle.pg.id
            runs = []
            layouts = [(n, gpus, where), (n, gpus, where), (other_n, other_gpus, "auto")]
            for k, (m, g, w) in enumerate(layouts):
                ex, placement = executor(m, g, w, source=source)
                line = run_line(ex, placement, ex.ready())
                line["same_actors"] = [a._actor_id for a in ex.actors] == made_actors
                line["same_pg"] = ex.pg.id == made_pg
                line["idle_left"] = len(source)
                runs.append(line)
                ex.close(reuse=k < 2)
            source.clear()
            print(json.dumps({"case": case, "runs": runs, "placement_groups_left": left()}), flush=True)
            continue
        busy = None
        if case[0] == "busy":
            from ray.util.placement_group import placement_group

            busy = placement_group([{"GPU": 1.0}] * (num_gpus - 1))
            ray.get(busy.ready(), timeout=30)
            n, gpus, where, timeout = case[1], 1.0, "per_client", case[2]
        else:
            (n, gpus, where), timeout = case, 60
        try:
            ex, placement = executor(n, gpus, where, timeout)
        except ConfigError as e:
            print(json.dumps({"case": case, "error": str(e)}), flush=True)
        else:
            print(json.dumps({"case": case, **run_line(ex, placement, ex.ready())}), flush=True)
            ex.close()
        if busy is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(busy)
    ray.shutdown()


if __name__ == "__main__":
    main()
