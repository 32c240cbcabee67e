"""Run by tests/test_cluster.py in a subprocess: a private local Ray on loopback that
declares fake GPUs, and the real placement + RayExecutor code creating the client actors
(CUDA check off, nothing fitted). Prints one JSON line per case:

    {"case": [...], "gpu_ids": [[...] per actor], "bundles": [...], "clients": [[...] per actor]}
    {"case": [...], "error": "<the ConfigError message>"}

usage: python tests/gpu_placement_probe.py <num_gpus> '<json list of cases>'
a case is [num_clients, gpus_per_client, placement] or ["busy", num_clients, timeout_s]
(3 of the GPUs held by another placement group, then ask for one GPU per client) or
["reuse", num_clients, gpus_per_client, other_num_clients] (warm workers in a `WorkerSource`, as a sweep's
session keeps: the same placement twice, then another number of clients; prints each executor's
worker pids, GPUs and reused count, and the placement groups left after the pool is cleared) or
["early", num_clients, gpus_per_client, run_gpus_per_client] (workers and their placement group
made as `Session.early_start` makes them (`WorkerSource.make`), then a run's executor asking
for run_gpus_per_client: it takes them when the two agree, else ends them; then one line with
the placement groups left after it closed).
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
        p = prepare(cfg)
        placement = placed(cfg)
        ex = RayExecutor(p.spec, p.dataset, p.split.train, p.split.test, placement, 0, source=source)
        return ex, placement

    def left() -> int:
        from ray.util import placement_group_table

        return len([t for t in placement_group_table().values() if t["state"] != "REMOVED"])

    for case in cases:
        if case[0] == "early":  # workers + group made as `early_start` does, then the run's executor
            _, n, gpus, run_gpus = case
            made = WorkerSource()
            made.make(placed(compose([
                "data=digits", "runtime=gpu", f"fl.num_clients={n}", f"runtime.gpus_per_client={gpus}",
            ])))  # fmt: skip
            (idle,) = made._idle.values()
            made_actors, made_pg = list(idle.actors), idle.pg
            ex, _ = executor(n, run_gpus, source=made)
            infos = ex.ready()
            print(json.dumps({
                "case": case, "prestarted": ex.prestarted, "gpu_ids": [i["gpu_ids"] for i in infos],
                "same_actors": [a._actor_id for a in ex.actors] == [a._actor_id for a in made_actors],
                "same_pg": ex.pg.id == made_pg.id, "none_pending": len(made) == 0,
            }), flush=True)  # fmt: skip
            ex.close()
            print(json.dumps({"case": ["left", *case], "placement_groups_left": left()}), flush=True)
            continue
        if case[0] == "reuse":  # a sequential sweep's runs (`Session(reuse_actors=True)`)
            runs = []
            pool = WorkerSource()
            for n in (case[1], case[1], case[3]):
                ex, _ = executor(n, case[2], source=pool)
                infos = ex.ready()
                runs.append({"reused": ex.reused, "pids": [i["pid"] for i in infos],
                             "gpu_ids": [i["gpu_ids"] for i in infos]})  # fmt: skip
                ex.close(reuse=True)
            pool.clear()
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
            infos = ex.ready()
            print(json.dumps({
                "case": case,
                "gpu_ids": [i["gpu_ids"] for i in infos],
                "clients": [i["clients"] for i in infos],
                "bundles": [placement.bundle_of(a) for a in range(placement.num_actors)],
                "bundle_shapes": placement.bundles(),
            }), flush=True)  # fmt: skip
            ex.close()
        if busy is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(busy)
    ray.shutdown()


if __name__ == "__main__":
    main()
