"""`fl-lightning partition <overrides>`: build (or load the cached) split a run would use,
print a per-client table and write `partition.json` + `partition.png`, without training.

    fl-lightning partition data=fmnist data.partition=shards data.classes_per_client=2 fl.num_clients=10

Files go to `<output_dir>/partitions/<dataset>-<partition>-k<clients>-s<seed>-<hash>/`.
"""

from __future__ import annotations

import json


def partition_command(overrides: list[str]) -> int:
    from ..config import compose

    cfg = compose(overrides)  # ConfigError (one line, exit 2) on bad input, before any loading
    from ..data.federated import partition_cache_dir, prepare_data
    from ..data.partition import PARTITIONERS
    from ..data.registry import DATASETS
    from ..data.stats import format_table, save_partition_plot
    from ..runtime.paths import resolve_output_dir

    DATASETS.get(cfg.data.name)
    PARTITIONERS.get(cfg.data.partition)
    dataset, split = prepare_data(cfg)
    stats = split.stats(dataset)
    name = f"{cfg.data.name}-{cfg.data.partition}-k{cfg.fl.num_clients}-s{cfg.seed}-{split.key[:8]}"
    out = resolve_output_dir(str(cfg.output_dir)) / "partitions" / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "partition.json").write_text(json.dumps(stats) + "\n")
    png = save_partition_plot(stats, out / "partition.png", partition_cache_dir(cfg.data))
    opts = ", ".join(f"{k}={v}" for k, v in split.options.items())
    print(
        f"{cfg.data.name}: {len(dataset.train_y)} training samples, {dataset.num_classes} classes"
        + (", multi-label" if dataset.multilabel else "")
        + f" | partition={cfg.data.partition}"
        + (f" ({opts})" if opts else "")
        + f" seed={cfg.seed}"
        + (" | from cache" if split.from_cache else "")
    )
    print(format_table(stats))
    print(f"wrote {out / 'partition.json'} and {png}")
    return 0
