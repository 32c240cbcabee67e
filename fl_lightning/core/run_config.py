"""The typed run config: one dataclass per section, each with its own `check()`, and the
checks across sections in one place (`cross_check`). Plain dataclasses: OmegaConf composes
the layers against them (`config/composition.py`) and `RootConfig.check` runs once the tree is
whole.

It lives in `core/` (as `OptimConfig` does), below the methods, data and models that read it:
a method's `check(run)` and a dataset's builder take a `RootConfig` without importing
`fl_lightning.config`, which imports them (to check names against their registries). The old
paths, `fl_lightning.config` and `fl_lightning.config.schema`, re-export these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .augment import AUGMENTATIONS
from .errors import ConfigError
from .optim import OptimConfig

#: the largest image side and random-crop padding a run may ask for (CLIP's 224, AlexNet-BN's
#: 256 and every config here are well below)
MAX_IMAGE_SIZE = 1024
MAX_AUGMENT_PADDING = 64


def _positive(section: str, obj: Any, *keys: str) -> None:
    """ConfigError naming the first of `keys` set (not null) to a value <= 0."""
    for key in keys:
        value = getattr(obj, key)
        if value is not None and value <= 0:
            raise ConfigError(f"{section}.{key} must be > 0 (got {value})")


def _at_least_zero(section: str, obj: Any, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        if value < 0:
            raise ConfigError(f"{section}.{key} must be >= 0 (got {value})")


@dataclass
class FLConfig:
    rounds: int = 10
    num_clients: int = 10
    clients_per_round: int | None = None  # overrides `fraction` when set
    fraction: float = 1.0
    #: [lo, hi]: unstable participation, each round int(J * num_clients) clients with J drawn
    #: uniformly, as PFLlib's random_join_ratio (the FedDTR paper's J ~ U[0.1, 1]); null: fixed
    fraction_range: list[float] | None = None
    local_epochs: int = 1
    local_steps: int | None = None  # caps optimizer steps per fit when set
    batch_size: int = 64
    max_client_failures: int = 0  # clients allowed to fail per round (dropped, logged)
    #: batch-norm running statistics of the global model: averaged (FedAvg of the clients'),
    #: recompute (pooled exactly from the sampled clients' data under the new weights), or
    #: local (each client keeps its own; evaluated on the clients' own test splits)
    bn_stats: Literal["averaged", "recompute", "local"] = "averaged"
    #: how a round's clients are drawn: uniform (a fixed number, without replacement), size
    #: (without replacement, each with probability its share of the training examples: FedLGT
    #: on FLAIR, Li et al. 2019) or poisson (each client joins independently with probability
    #: clients_per_round / num_clients, so cohorts vary in size: the sampling model of the
    #: add/remove-one privacy accountants, docs/privacy.md)
    sampling: Literal["uniform", "size", "poisson"] = "uniform"

    def check(self) -> None:
        _positive("fl", self, "rounds", "num_clients", "local_epochs", "batch_size", "clients_per_round",
                  "local_steps")  # fmt: skip
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"fl.fraction must be in (0, 1] (got {self.fraction})")
        fr = self.fraction_range
        if fr is not None:
            if len(fr) != 2 or not 0 < fr[0] <= fr[1] <= 1:
                raise ConfigError(
                    f"fl.fraction_range must be [lo, hi] with 0 < lo <= hi <= 1 (got {list(fr)})"
                )
            if self.clients_per_round is not None:
                raise ConfigError("set fl.fraction_range or fl.clients_per_round, not both")
        if _per_round(self) > self.num_clients:
            raise ConfigError(
                f"fl.clients_per_round={_per_round(self)} exceeds fl.num_clients={self.num_clients}"
            )
        _at_least_zero("fl", self, "max_client_failures")


@dataclass
class DataConfig:
    name: str = "fmnist"
    root: str = "${oc.env:FL_LIGHTNING_DATA,'~/.cache/fl_lightning/data'}"
    download: bool = False
    partition: str = "dirichlet"  # iid | dirichlet | dirichlet_balanced | shards | longtail | domain | ...
    alpha: float = 0.5  # Dirichlet concentration (dirichlet[_balanced], longtail, multilabel_dirichlet)
    min_size: int = 10  # dirichlet: every client gets at least this many samples
    classes_per_client: int = 2  # shards: exactly this many classes per client; class_blocks: C per block
    imbalance_factor: float = 1.0  # long tail: max/min class count (cifar*_lt datasets, longtail partition)
    client_test_fraction: float = 0.0
    train_subset: int | None = None  # first N training samples (quick runs, tests)
    test_subset: int | None = None
    #: FedDF / FedBE: N training images held out of every client as the server's unlabeled set
    server_subset: int | None = None
    #: resize every image to this square size when the data is loaded (cached like the decoded
    #: images); null: the dataset's own size (folder/HDF5 datasets: their default, e.g. Office 256)
    image_size: int | None = None
    #: training-time augmentation of the clients' batches, in this order (core/augment.py):
    #: random_crop (pad augment_padding, crop back), hflip (p 0.5), rotate (within
    #: +-augment_degrees); evaluation never augments
    augment: list[str] = field(default_factory=list)
    augment_padding: int = 4
    augment_degrees: float = 15.0
    domains: list[str] | None = None  # domain datasets: which domains to load (default: all)
    #: data=coop_multi: the CoOp datasets federated in one run, in label order (null: FedTPG's
    #: nine, `data/coop_multi.py`)
    datasets: list[str] | None = None
    fine_grained: bool = False  # flair: the 1,628 fine-grained labels instead of the 17 coarse ones
    max_users: int | None = None  # flair: read only the first N training users
    #: flair's coarse labels named, for the text encoders, by their fine labels (FedLGT's "Concat.
    #: prompt": the 20 most frequent, comma-joined; data/multilabel.py `coarse_prompts_of`)
    coarse_prompts: bool = False
    #: fmnist_multilabel: build the training mosaics from the first N training images only, so
    #: images N.. stay out of every client (`fl-lightning pretrain` learns from them)
    source_subset: int | None = None
    cache_partitions: bool = True  # cache splits in <root>/.partitions/<hash>.npz
    #: few-shot protocols (data/protocols.py). shots: k training images per class, CoOp's draw
    #: (random.Random(shots_seed), random.sample per class); CoOp draws with the run seed, 1-3
    shots: int | None = None
    shots_seed: int = 1
    #: p further training images per class held out as the clients' own test splits, each client
    #: testing on those of its own classes (FLiP's personal split, p = shots); needs shots
    personal_shots: int | None = None
    #: instead, the test split's images of the classes each client trains on (PromptFL / FedOTP)
    personal_from_test: bool = False
    #: base-to-new: train on the base half of the classes (the first ceil(C/2) labels), test on
    #: all; evaluations add base_accuracy, new_accuracy, base_new_hm
    base_new: bool = False

    def check(self) -> None:
        _positive("data", self, "alpha", "train_subset", "test_subset", "server_subset")
        if self.personal_shots and not self.shots:
            raise ConfigError(
                "data.personal_shots needs data.shots (the held-out images follow the k-shot draw)"
            )
        sources = (self.personal_shots, self.personal_from_test, self.client_test_fraction > 0)
        if sum(map(bool, sources)) > 1:
            raise ConfigError(
                "set one of data.personal_shots, data.personal_from_test and data.client_test_fraction"
            )
        if not 0 <= self.client_test_fraction < 1:
            raise ConfigError(
                f"data.client_test_fraction must be in [0, 1) (got {self.client_test_fraction})"
            )
        _at_least_zero("data", self, "min_size")
        _positive("data", self, "classes_per_client", "image_size", "max_users", "shots", "personal_shots")
        for name in self.augment:
            if name not in AUGMENTATIONS:
                valid = ", ".join(AUGMENTATIONS)
                raise ConfigError(f"data.augment: unknown augmentation {name!r}; valid: {valid}")
        if len(set(self.augment)) != len(self.augment):
            raise ConfigError(f"data.augment names an augmentation twice ({list(self.augment)})")
        _at_least_zero("data", self, "augment_padding")
        # bounded: every image is resized to image_size up front, and each batch padded (10^5 px
        # asked for terabytes: a MemoryError, or a machine filled before it)
        if self.image_size is not None and self.image_size > MAX_IMAGE_SIZE:
            raise ConfigError(f"data.image_size must be at most {MAX_IMAGE_SIZE} (got {self.image_size})")
        if self.augment_padding > MAX_AUGMENT_PADDING:
            raise ConfigError(
                f"data.augment_padding must be at most {MAX_AUGMENT_PADDING} (got {self.augment_padding})"
            )
        if not 0 <= self.augment_degrees <= 180:
            raise ConfigError(f"data.augment_degrees must be in [0, 180] (got {self.augment_degrees})")
        if self.imbalance_factor < 1:
            raise ConfigError(f"data.imbalance_factor must be >= 1 (got {self.imbalance_factor})")
        if self.partition == "longtail" and self.imbalance_factor <= 1:
            raise ConfigError("data.partition=longtail needs data.imbalance_factor > 1 (e.g. 10, 50, 100)")


@dataclass
class EvalConfig:
    every: int = 1
    batch_size: int = 1000
    clients: bool = True  # also evaluate on each client's own test split, when it has one
    #: which model of each client is evaluated on its own test split: `received` (the model it
    #: would start the next round from: the round's aggregate plus its personal parts; PFLlib's
    #: point, all clients) or `trained` (the model right after its local training, before it
    #: uploads; FedDTR's code; the round's participants only)
    timing: Literal["received", "trained"] = "received"
    #: with timing=received: evaluate this many clients, one seeded sample fixed for the run
    #: (the same clients every round, and for every method with the same seed), so an
    #: evaluation round's cost does not grow with fl.num_clients; null: every client
    clients_sample: int | None = None
    #: where the driver evaluates the global model (auto: cuda if any)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    per_class: bool = False  # single-label: also class_accuracy/<c> for every class
    #: long-tail groups by training-set class counts: [many_above, few_below] gives
    #: many_/medium_/few_accuracy (ImageNet-LT: [100, 20]); null: none
    longtail: list[int] | None = None
    threshold: float = 0.5  # multi-label: decision threshold on sigmoid scores (C-P, C-R, C-F1, O-*)
    #: write the final round's global scores and targets to <run dir>/predictions.npz
    save_predictions: bool = False
    #: run round r's global evaluation on a driver thread while round r + 1 trains (same numbers;
    #: the last round waits for its own); false: evaluate before the next round starts
    overlap: bool = True

    def check(self) -> None:
        _positive("eval", self, "every")
        if not 0 < self.threshold < 1:
            raise ConfigError(f"eval.threshold must be in (0, 1) (got {self.threshold})")
        lt = self.longtail
        if lt is not None and (len(lt) != 2 or lt[0] < lt[1] or lt[1] < 0):
            raise ConfigError(
                "eval.longtail must be [many_above, few_below] with many_above >= few_below >= 0 "
                f"(got {list(lt)})"
            )
        if self.clients_sample is not None and self.timing != "received":
            raise ConfigError(
                "eval.clients_sample applies to eval.timing=received (trained evaluates the participants)"
            )


@dataclass
class CheckpointConfig:
    every: int = 1  # rounds between checkpoints (the last round is always checkpointed)

    def check(self) -> None:
        _positive("checkpoint", self, "every")


@dataclass
class AggregatorConfig:
    """The aggregation chain (`core/aggregation.py`): steps between the clients' updates and the
    method's server step, in order; empty: FedAvg's example-weighted mean. `clip_l2` clips each
    update's delta to `clip`, `uniform` weighs every update 1, `gaussian` adds N(0, (σ·C/m)²) to
    the mean (σ = `noise_multiplier`). A privacy guarantee with an accountant is `privacy=`'s."""

    steps: list[str] = field(default_factory=list)
    clip: float = 1.0  # C: the L2 bound of one update's delta (clip_l2, gaussian, distributed_gaussian)
    noise_multiplier: float = 0.0  # σ (gaussian, distributed_gaussian)
    # secagg_plus (core/secagg.py, docs/secagg.md): Flower's numbers by default
    secagg_clip_range: float = 8.0  # c: each coordinate of a weighted update clipped to [-c, c]
    secagg_levels: int = 4194304  # L = 2^22: [-c, c] quantised to the integers [0, L]
    secagg_modulus: int = 4294967296  # M = 2^32 (a power of two <= 2^62); needs clients_per_round·L < M
    secagg_neighbours: int | None = None  # k, even (SecAgg+'s graph); null: every other client (SecAgg)
    secagg_threshold: int | None = None  # t of the k+1 holders (neighbours, self); null: a majority
    secagg_dropout: float = 0.0  # fraction of each round's cohort that drops after sharing (simulated)
    secagg_max_weight: float | None = None  # w enters as w/max_weight; null: the largest client's examples

    def check(self) -> None:
        from .chain import check_chain

        _positive("aggregator", self, "clip", "secagg_clip_range", "secagg_levels", "secagg_neighbours",
                  "secagg_threshold", "secagg_max_weight")  # fmt: skip
        _at_least_zero("aggregator", self, "noise_multiplier")
        check_chain(list(self.steps))
        m = int(self.secagg_modulus)
        if m < 2 or m & (m - 1) or m > 2**62:
            raise ConfigError(f"aggregator.secagg_modulus must be a power of two <= 2^62 (got {m})")
        if not 0 <= self.secagg_dropout < 1:
            raise ConfigError(f"aggregator.secagg_dropout must be in [0, 1) (got {self.secagg_dropout})")
        if self.secagg_neighbours is not None and self.secagg_neighbours % 2:
            raise ConfigError(
                f"aggregator.secagg_neighbours must be even (k/2 neighbours each side of a ring; got "
                f"{self.secagg_neighbours})"
            )


@dataclass
class SystemConfig:
    """The clients' hardware and the server's mode on a virtual clock (`runtime/system.py`,
    `runtime/scheduler.py`, docs/async.md). The default is today's: every client takes no time,
    synchronous rounds. A client's update takes examples × epochs × `seconds_per_example` ×
    its speed factor (drawn once per run: `speed`) × a noise factor (`noise`, mean 1)."""

    mode: Literal["sync", "fedbuff", "fedasync"] = "sync"
    #: virtual: arrivals ordered by the modelled durations (reproducible); wall (runtime=ray):
    #: in the order Ray's workers finish, each recorded in the run's `arrivals.jsonl`
    clock: Literal["virtual", "wall"] = "virtual"
    #: a wall-clock run's `arrivals.jsonl`: its arrivals replayed on the virtual clock (null: none)
    replay: str | None = None
    seconds_per_example: float = 0.0  # 0: every client takes no time
    #: per-client speed factor: none (1), tiers (uniformly one of `tiers`), lognormal
    #: (exp N(0, sigma²)), trace (a file of per-client durations in seconds, one a line)
    speed: Literal["none", "tiers", "lognormal", "trace"] = "none"
    tiers: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    sigma: float = 0.5
    trace: str | None = None
    #: each update's noise factor: constant (1), half_normal (|N(0,1)|·sqrt(pi/2)), exponential (Exp(1))
    noise: Literal["constant", "half_normal", "exponential"] = "constant"
    #: always, or a fixed fraction online (redrawn each round / each dispatch)
    availability: Literal["always", "fraction"] = "always"
    online: float = 1.0
    #: synchronous rounds: updates arriving more than this many virtual seconds after the round
    #: started are dropped (and counted); null: none
    deadline: float | None = None
    #: synchronous rounds: sample ceil(over_select · K) clients, keep the first K to arrive
    over_select: float = 1.0
    concurrency: int = 10  # fedbuff/fedasync: M, clients in flight at all times
    buffer: int = 10  # fedbuff: K, updates buffered per server step (fedasync: 1)
    staleness: Literal["constant", "polynomial", "hinge"] = "polynomial"
    staleness_a: float = 0.5
    staleness_b: float = 4.0
    mix: float = 0.6  # fedasync: α, the mixing weight of one arrival
    max_staleness: int | None = None  # staler updates are dropped (and counted); null: none

    def check(self) -> None:
        _at_least_zero("system", self, "seconds_per_example", "sigma", "staleness_a", "staleness_b")
        _positive("system", self, "concurrency", "buffer", "deadline")
        if not 0.0 < self.online <= 1.0:
            raise ConfigError(f"system.online must be in (0, 1] (got {self.online})")
        if self.over_select < 1.0:
            raise ConfigError(f"system.over_select must be >= 1 (got {self.over_select})")
        if not 0.0 < self.mix <= 1.0:
            raise ConfigError(f"system.mix must be in (0, 1] (got {self.mix})")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"system.max_staleness must be >= 0 (got {self.max_staleness})")
        if self.speed == "tiers" and (not self.tiers or min(self.tiers) <= 0):
            raise ConfigError(f"system.tiers must be positive speed factors (got {self.tiers})")
        if self.speed == "trace" and not self.trace:
            raise ConfigError("system.speed=trace needs system.trace=<file of per-client durations>")
        if self.mode == "fedbuff" and self.buffer > self.concurrency:
            raise ConfigError(
                f"system.buffer (K={self.buffer}) must be <= system.concurrency (M={self.concurrency})"
            )
        modelled = self.seconds_per_example > 0 or self.speed != "none" or self.noise != "constant"
        if (self.clock == "wall" or self.replay) and modelled:
            given = "system.clock=wall measures" if self.clock == "wall" else "system.replay gives"
            raise ConfigError(
                f"{given} each update's duration: system.seconds_per_example, speed and noise model it "
                "on the virtual clock; leave them unset"
            )
        if self.clock == "wall" and self.replay:
            raise ConfigError(
                "system.replay replays a wall-clock run on the virtual clock: set system.clock=virtual"
            )
        if self.mode != "sync" and (self.deadline is not None or self.over_select != 1.0):
            raise ConfigError(
                f"system.deadline and system.over_select are for synchronous rounds, not {self.mode}"
            )


@dataclass
class RuntimeConfig:
    executor: Literal["ray", "serial"] = "ray"
    # "auto" or host:port joins a cluster; null: $RAY_ADDRESS (a Ray job's cluster), else local
    address: str | None = None
    placement: Literal["auto", "per_client", "pool"] = "auto"
    num_actors: int | None = None  # pool size; default: one per CPU (or GPU)
    num_cpus: int | None = None  # size of a local Ray instance; default: all
    num_gpus: int | None = None
    cpus_per_client: float | None = None  # CPUs per actor; default: an even share
    gpus_per_client: float | None = None  # default: 1 when GPUs exist
    #: torch threads per fit; default: $FL_LIGHTNING_THREADS_PER_CLIENT, else the CPU share
    threads_per_client: int | None = None
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    #: the GPU placement group's strategy
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    schedule_timeout_s: float | None = 120.0  # wait this long for the GPU bundles; null: forever
    #: clients' batches drawn by index from their shard on the fit's device (the shard is copied
    #: there once per fit); false: a torch DataLoader. Same batches, same numbers either way.
    resident_shards: bool = True
    #: local training, Lightning's: 32 | bf16-mixed | 16-mixed (on a CPU Lightning makes 16-mixed bf16)
    precision: Literal["32", "bf16-mixed", "16-mixed"] = "32"
    #: a cold CLI run on a private local Ray starts Ray and its client workers while the driver
    #: imports torch and Lightning (`runtime/early.py`); false: one after the other. Same numbers.
    early_start: bool = True
    #: train a round's clients K at a time in one process, their weights stacked (torch.func);
    #: same numbers to float rounding, for methods whose client step is written for it; 0: one by one
    batched: int = 0

    def check(self) -> None:
        _positive("runtime", self, "num_actors", "num_cpus", "cpus_per_client", "gpus_per_client",
                  "threads_per_client", "schedule_timeout_s")  # fmt: skip
        _at_least_zero("runtime", self, "batched")
        if self.num_gpus is not None and self.num_gpus < 0:
            raise ConfigError(f"runtime.num_gpus must be >= 0 (got {self.num_gpus})")


@dataclass
class LoggerConfig:
    backend: Literal["wandb", "none"] = "wandb"
    project: str = "fl_lightning"
    entity: str | None = None
    group: str | None = None  # default: the experiment name
    #: auto: online with an API key, else offline (`$WANDB_MODE` wins, and may say shared:
    #: W&B's mode for one run written from several machines)
    mode: Literal["auto", "online", "offline", "disabled", "shared"] = "auto"
    tags: list[str] = field(default_factory=list)


@dataclass
class PrivacyConfig:
    """Differential privacy (docs/privacy.md): `privacy=dp_fedavg` (user-level, central: each
    client's update clipped, uniform mean, Gaussian noise) or `privacy=dp_sgd` (sample-level, in
    each client through Opacus); `none` by default."""

    name: Literal["none", "dp_fedavg", "dp_sgd"] = "none"
    #: C: the L2 bound of each client's update (dp_fedavg; adaptive: the first round's) or of
    #: each example's gradient (dp_sgd)
    clip: float = 1.0
    #: σ: noise std over C (dp_fedavg: on the sum of clipped updates, σ·C/m on their mean);
    #: null: found from target_epsilon for fl.rounds rounds
    noise_multiplier: float | None = None
    target_epsilon: float | None = None  # ε after fl.rounds rounds (σ found so it never overshoots)
    delta: float = 1e-5  # δ of the (ε, δ) reported; below 1/fl.num_clients (user level)
    #: stop the run cleanly before a round would take ε past this; null: no stop
    max_epsilon: float | None = None
    accountant: Literal["rdp", "pld"] = "rdp"  # dp-accounting's (pld needs fl.sampling=poisson)
    #: adaptive clipping (Andrew et al. 2021): C follows the target_quantile of the update norms
    #: geometrically (rate clip_lr), from a clipped count noised with std clipped_count_stddev
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    #: σ_b; null: clients per round / 20 (Andrew et al.'s, Flower's), or σ where that is below it
    clipped_count_stddev: float | None = None

    def check(self) -> None:
        if self.name == "none":
            return
        _positive("privacy", self, "clip", "target_epsilon", "max_epsilon", "clip_lr", "clipped_count_stddev")
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ConfigError(
                f"privacy={self.name} needs exactly one of privacy.noise_multiplier and "
                "privacy.target_epsilon, the other null (e.g. privacy.target_epsilon=4 "
                "privacy.noise_multiplier=null)"
            )
        if self.noise_multiplier is not None and self.noise_multiplier < 0:
            raise ConfigError(f"privacy.noise_multiplier must be >= 0 (got {self.noise_multiplier})")
        if not 0 < self.delta < 1:
            raise ConfigError(f"privacy.delta must be in (0, 1) (got {self.delta})")
        if not 0 <= self.target_quantile <= 1:
            raise ConfigError(f"privacy.target_quantile must be in [0, 1] (got {self.target_quantile})")
        if self.name == "dp_sgd" and self.noise_multiplier is None:
            raise ConfigError(
                "privacy=dp_sgd takes privacy.noise_multiplier (a target ε is not calibrated for DP-SGD yet)"
            )
        if self.adaptive and self.name != "dp_fedavg":
            raise ConfigError("privacy.adaptive (adaptive clipping) applies to privacy=dp_fedavg")
        if self.adaptive and self.noise_multiplier is not None and self.clipped_count_stddev is not None:
            from .privacy.accountant import adaptive_noise_multipliers

            # the update's noise multiplier, as the run's plan computes it: a σ_b too small is refused
            adaptive_noise_multipliers(self.noise_multiplier, self.clipped_count_stddev)
        planned, most = self.target_epsilon, self.max_epsilon
        if most is not None and planned is not None and most < planned:
            raise ConfigError(
                f"privacy.max_epsilon={most:g} is below privacy.target_epsilon={planned:g}: "
                "the run would stop before its planned rounds"
            )


@dataclass
class RootConfig:
    experiment: str = "default"
    seed: int = 0
    output_dir: str = "runs"
    run_id: str | None = None
    #: the row of a reproduction (`fl-lightning reproduce`) this run is: its W&B run name and
    #: config, and summary.json's `row`, so that ablations of one method stay apart (`compare --by row`)
    row: str | None = None
    #: what sets this run apart within its experiment: its W&B job type and run name
    #: (`<variant>-s<seed>`), and `variant` in summary.json (`compare --by variant`); null: the
    #: reproduction row, else the method. `sweep` sets it to the method and the swept keys
    #: (`fedprox tau=0.1`); config.yaml records the value the run used
    variant: str | None = None
    #: the method's config dataclass (`MethodConfig`; a mapping only inside composition)
    method: Any = None
    data: DataConfig = field(default_factory=DataConfig)
    #: the model and the text encoder: `name` and the builder's own arguments
    model: dict[str, Any] = field(default_factory=dict)
    text: dict[str, Any] = field(default_factory=dict)
    fl: FLConfig = field(default_factory=FLConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    #: modules outside the package imported for the methods they register, comma-separated
    #: (`methods=mypkg.fedfoo`); an installed package can name its modules under the entry-point
    #: group `fl_lightning.methods` instead, and needs no key
    methods: str = ""

    def check(self) -> None:
        """Each section's own checks, then those across sections (`cross_check`). The method's
        own (`method`: a mapping until the registries are read) come later, in
        `registered.validate_registered`; `model` and `text` are checked against their builders there."""
        if not 0 <= self.seed < 2**32:  # numpy's and Lightning's seeding take no more
            raise ConfigError(f"seed must be in [0, 2**32) (got {self.seed})")
        for section in (
            self.fl,
            self.data,
            self.optim,
            self.eval,
            self.checkpoint,
            self.runtime,
            self.aggregator,
            self.system,
            self.privacy,
        ):
            section.check()
        cross_check(self)


def cross_check(run: RootConfig) -> None:
    """The checks that read two sections: the one place for them."""
    fl, data, ev = run.fl, run.data, run.eval
    agg = run.aggregator
    if "secagg_plus" in agg.steps:
        m = _per_round(fl)
        if m * int(agg.secagg_levels) >= int(agg.secagg_modulus):
            raise ConfigError(
                f"secagg_plus would overflow: {m} clients a round · {agg.secagg_levels} levels >= modulus "
                f"{agg.secagg_modulus} (the sum wraps); raise aggregator.secagg_modulus or lower "
                "aggregator.secagg_levels"
            )
        if m < 2:
            raise ConfigError(
                f"secagg_plus needs at least 2 clients a round (got {m}): a sum of one is its update"
            )
        k = m - 1 if agg.secagg_neighbours is None else min(int(agg.secagg_neighbours), m - 1)
        if agg.secagg_threshold is not None and int(agg.secagg_threshold) > k + 1:
            raise ConfigError(
                f"secagg_plus: aggregator.secagg_threshold={agg.secagg_threshold} exceeds the {k + 1} "
                f"holders (its {k} neighbours and itself) each of {m} clients a round shares its secrets with"
            )
    if fl.bn_stats == "local" and not client_tests(data):
        raise ConfigError(
            "fl.bn_stats=local keeps each client's batch-norm statistics, so models are evaluated on "
            "each client's own test split: set data.client_test_fraction (e.g. 0.25)"
        )
    if data.augment and run.runtime.batched:
        raise ConfigError(
            "runtime.batched trains from precomputed batch indices and does not apply data.augment; "
            "use runtime.batched=0"
        )
    _privacy_check(run)
    if ev.clients_sample is not None and not 1 <= ev.clients_sample <= fl.num_clients:
        raise ConfigError(
            f"eval.clients_sample must be in [1, fl.num_clients={fl.num_clients}] (got {ev.clients_sample})"
        )


def _privacy_check(run: RootConfig) -> None:
    """What the accountant's sampling model needs of the cohorts (docs/privacy.md)."""
    fl, pv = run.fl, run.privacy
    if fl.sampling == "poisson" and fl.fraction_range is not None:
        raise ConfigError(
            "fl.sampling=poisson draws each client with one probability: unset fl.fraction_range"
        )
    if pv.name == "none":
        return
    if fl.fraction_range is not None or fl.sampling == "size":
        what = "fl.fraction_range" if fl.fraction_range is not None else "fl.sampling=size"
        raise ConfigError(
            f"privacy={pv.name} accounts for uniform cohorts (fl.sampling=uniform or poisson); "
            f"{what} draws clients another way"
        )
    if pv.name == "dp_sgd" and run.runtime.batched:
        raise ConfigError(
            "privacy=dp_sgd trains each client through Opacus' optimiser: use runtime.batched=0"
        )
    if pv.accountant == "pld" and fl.sampling != "poisson" and pv.name == "dp_fedavg":
        raise ConfigError(
            "privacy.accountant=pld needs fl.sampling=poisson (dp-accounting's PLD has no analysis of "
            "fixed-size cohorts drawn without replacement); use privacy.accountant=rdp"
        )
    if pv.name == "dp_fedavg" and fl.bn_stats == "recompute":
        raise ConfigError(
            "privacy=dp_fedavg privatises the model delta only; fl.bn_stats=recompute also uploads "
            "each client's batch-norm statistics of the new model: use fl.bn_stats=averaged"
        )
    if pv.name == "dp_fedavg":
        _dp_fedavg_chain_check(run)
    if pv.name == "dp_fedavg" and pv.delta >= 1 / fl.num_clients:
        raise ConfigError(
            f"privacy.delta={pv.delta:g} must be below 1/fl.num_clients = {1 / fl.num_clients:g} "
            "(user-level: a larger δ allows revealing a whole client)"
        )


def _dp_fedavg_chain_check(run: RootConfig) -> None:
    """privacy=dp_fedavg is the round's whole aggregation (clip, uniform weights, noise) on a
    synchronous cohort: what would change its noise or sensitivity is refused here, from the
    config alone, before Ray or a worker starts (`build_aggregator` then builds it)."""
    if run.system.mode != "sync":  # the accountant's sampling model is a round's cohort
        raise ConfigError(
            f"privacy=dp_fedavg accounts for synchronous rounds of sampled cohorts: use system.mode=sync "
            f"(not {run.system.mode})"
        )
    steps = list(run.aggregator.steps)
    if any(n in ("secagg_plus", "distributed_gaussian") for n in steps):
        # the noise would be the clients' shares, which no accountant here composes
        raise ConfigError(
            f"privacy=dp_fedavg with secure aggregation (aggregator.steps={steps}) "
            "is not supported yet: distributed_gaussian adds each client's share of the noise before "
            "secagg_plus's masked sum, but the accountant for it is missing (the shares of clients "
            "that drop, and secagg_plus's per-coordinate clip and quantisation, change the sum's "
            "noise and sensitivity: a distributed discrete Gaussian analysis, Kairouz et al. 2021); "
            "use privacy=dp_fedavg without aggregator.steps, or secagg_plus without privacy"
        )
    if steps:
        raise ConfigError(
            f"privacy=dp_fedavg is its own aggregation chain (clip, uniform weights, noise): unset "
            f"aggregator.steps={steps}"
        )


def variant_of(cfg: Any) -> str:
    """The run's variant (`RootConfig.variant`): as set, else the reproduction row, else the method."""
    return str(cfg.variant or cfg.row or cfg.method.name)


def clients_per_round(cfg: Any) -> int:
    """Clients sampled per round (with `fl.fraction_range`: the most in any round)."""
    return _per_round(cfg.fl)


def participation(cfg: Any) -> tuple[int, int] | None:
    """`fl.fraction_range` as (fewest, most) clients per round; None for a fixed number."""
    return _span(cfg.fl)


def _per_round(fl: Any) -> int:
    if fl.clients_per_round is not None:
        return int(fl.clients_per_round)
    span = _span(fl)
    if span is not None:
        return span[1]
    return max(1, int(round(fl.fraction * fl.num_clients)))


def _span(fl: Any) -> tuple[int, int] | None:
    """PFLlib's counts: int(J * num_clients) for J at either end of the range, at least 1."""
    if fl.fraction_range is None:
        return None
    lo, hi = (float(v) for v in fl.fraction_range)
    return max(1, int(lo * fl.num_clients)), max(1, int(hi * fl.num_clients))


def client_tests(data: Any) -> bool:
    """Whether clients hold their own test splits: a fraction of their images, the personal
    images held out per class (`data.personal_shots`) or the test images of their classes."""
    return bool(data.client_test_fraction > 0 or data.personal_shots or data.personal_from_test)
