"""What a method's clients release under `privacy=dp_fedavg` besides the model delta, from its
name and config alone: the command line refuses a method with an unprivatised channel before
Ray, a worker or torch is touched (`config/registered.py::check_method`), and `PrivacyPlan`
counts the releases a round makes. Torch-free, as `accountant.py`."""

from __future__ import annotations

from typing import Any

#: methods whose clients upload something besides the model delta (or whose server builds a
#: model per client from individual updates), which `privacy=dp_fedavg` does not privatise
OTHER_CHANNELS: dict[str, str] = {
    "fedtgp": "class prototypes (mean features per class, and their counts) to a server that trains on "
    "them (privatised for fedproto and fedtsp only)",
    "creff": "per-class feature gradients and class counts",
    "clip2fl": "per-class feature gradients and class counts (CReFF's federated features)",
    "ccvr": "per-class feature means, covariances and counts",
    "feddistill": "per-class mean logits and counts",
    "scaffold": "control-variate deltas",
    "fednova": "local step counts (its normalised averaging)",
    "fedfomo": "weights over other clients' models from its validation loss (and per-client models)",
    "fedamp": "nothing else, but its server builds a model per client from individual updates",
}


#: methods whose class prototypes privacy=dp_fedavg privatises (core/privacy/prototypes.py)
PRIVATE_PROTOTYPES = ("fedproto", "fedtsp")


def releases_of(method: str, config: Any) -> int:
    """How many Gaussian releases a round of `method` (its config `config`) makes under
    privacy=dp_fedavg: the model's, and the prototype methods' prototype sum and holder count
    (without shared weights those two only)."""
    if method not in PRIVATE_PROTOTYPES:
        return 1
    return 2 + int(bool(getattr(config, "share_weights", False)))


def channel_refusal(method: str, config: Any = None) -> str | None:
    """One line refusing `method` under privacy=dp_fedavg, or None when what it uploads is
    privatised (its model; FedProto's and FedTSP's prototypes too)."""
    if method == "fedtsp" and getattr(config, "weighting", "uniform") == "count":
        return (
            "privacy=dp_fedavg averages FedTSP's image prototypes over the clients that hold each class "
            "(a noised count): the example counts method.weighting=count needs have no bound a noise "
            "could be set for; add method.weighting=uniform (the authors' code)"
        )
    channel = OTHER_CHANNELS.get(method)
    if channel is None:
        return None
    return (
        f"privacy=dp_fedavg privatises the model delta only; method={method} also uploads {channel}, "
        "which would be released without noise: use a method that uploads only its model "
        "(fedavg, fedprox, fedavgm, fedadam, fedglcl, promptfl, ...)"
    )


#: adaptive clipping with prototype releases: the clip follows the model updates' norms only
ADAPTIVE_WITH_PROTOTYPES = (
    "privacy.adaptive moves the clip from the model updates' norms; the prototypes this "
    "method also uploads are clipped to a fixed privacy.clip: set privacy.adaptive=false"
)


def adaptive_refusal(method: str, config: Any = None) -> str | None:
    """One line refusing adaptive clipping for a method whose round makes more than one release
    (its prototypes are clipped to a fixed `privacy.clip`), or None."""
    return ADAPTIVE_WITH_PROTOTYPES if releases_of(method, config) > 1 else None
