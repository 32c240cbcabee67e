"""Secure aggregation, SecAgg+ (Bell et al. 2020; Bonawitz et al. 2017), on the aggregation seam:
the server learns the sum of the cohort's updates and nothing of any one of them.

Each round, per client u of the cohort (the clients whose update arrived):

0. u makes two X25519 key pairs (one to agree mask seeds, one to encrypt shares) and
   advertises the public halves.
1. The server draws a k-regular graph over the cohort (a ring over a seeded permutation with
   k/2 neighbours each side: SecAgg+'s Harary graph; k ≥ n − 1 is every pair, SecAgg). u
   draws its self-mask seed b_u and Shamir-shares b_u and its mask secret key among its k
   neighbours (threshold t), each share encrypted (AES-GCM) under the key u agrees with that
   neighbour; the server routes the ciphertexts, which it cannot read.
2. u clips its weighted update to ±c per coordinate, quantises it to [0, L] by stochastic
   rounding and sends y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u)} ±PRG(s_uv) mod M, where s_uv comes from
   X25519(u, v) through HKDF and + is for u < v: the pairwise masks cancel in the sum.
   Clients that drop after step 1 send nothing.
3. The server tells the survivors who survived and who dropped; each reveals, of the shares it
   holds, the b-share of a survivor and the key-share of a dropped client, never both of one
   client. The server rebuilds b_u for each survivor and the mask key of each dropped client
   from t shares, removes the self masks and the dropped clients' pairwise masks, and holds
   Σ x_u mod M. Fewer than t shares of any secret: the round fails (`SecAggFailure`).

The sum is exact mod M while n·L < M (refused otherwise: an overflow would wrap silently), so
the mean's only error is the quantisation's: below one step 2c/L per client per coordinate.

Trusted simulation: every party runs in the driver, and every secret (key pairs, self-mask
seeds, Shamir coefficients, stochastic rounding) is drawn from `ServerContext.generator`,
seeded by (seed, round, client), so serial == Ray and a resumed run are exact. Anyone with the
run's seed could recompute every key: a deployment draws them from a cryptographic RNG on each
device and sends the messages over real transport (`docs/secagg.md`). The structure is still the
protocol's: the server side (`SecAggServer`, `SecureAggregator.add`/`result`, the strategy) only
ever holds the messages above, never a client's update, and the masks are expanded by a
cryptographic PRG (AES-256-CTR) from agreed keys.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .aggregation import (
    Accumulator,
    Aggregate,
    AggregationStep,
    Aggregator,
    Contribution,
    register_step,
    step_tag,
)
from .errors import ClientFailure, ConfigError
from .messages import ClientUpdate, ServerState
from .types import ClientId, Metrics, StateDict

if TYPE_CHECKING:
    from .strategy import ServerContext

__all__ = [
    "DistributedGaussian",
    "MaskedUpdate",
    "SecAggClient",
    "SecAggFailure",
    "SecAggParams",
    "SecAggPlus",
    "SecAggServer",
    "SecureAggregator",
    "dequantize",
    "harary_graph",
    "prg",
    "quantize",
    "shamir_combine",
    "shamir_split",
]

#: Shamir's field: the Mersenne prime 2^521 − 1 holds a 32-byte secret in one share
PRIME = 2**521 - 1
SHARE_BYTES = 66  # an element of the field
KEY_BYTES = 32
#: the server's generators' tag in place of a client id (the graph, the simulated dropouts)
SERVER = 2**32 - 1


class SecAggFailure(ClientFailure):
    """Too few clients survived to unmask the round's sum (fewer than t shares of a secret),
    or the sum would overflow: the round fails, as when every client fails."""


class ShamirError(ValueError):
    """Fewer shares than the threshold: the secret is undetermined."""


# ---------------------------------------------------------------------------------------------
# Numerics: clipping, quantisation, the PRG


@dataclass(frozen=True)
class SecAggParams:
    """The protocol's numbers (Flower's defaults: clip ±8.0, 2^22 levels, modulus 2^32).

    Attributes:
        clip_range: c: each coordinate of a client's weighted update clipped to [−c, c].
        levels: L: [−c, c] maps to the integers [0, L]; one step is 2c/L.
        modulus: M, a power of two ≤ 2^62: the sum is exact mod M while n·L < M.
        neighbours: k, the graph's degree (even); None or ≥ n − 1: every other client (SecAgg).
        threshold: t shares rebuild a secret; None: ⌊(k + 1)/2⌋ + 1, a majority of the k + 1
            holders of a client's shares (its neighbours and itself, as SecAgg shares with all).
        dropout: the fraction of the cohort that drops after sharing its keys (a simulation).
        max_weight: a client's weight w enters as w/max_weight before clipping (Flower's
            `max_weight`), so the weighted update stays in range; None: the run's largest.
    """

    clip_range: float = 8.0
    levels: int = 2**22
    modulus: int = 2**32
    neighbours: int | None = None
    threshold: int | None = None
    dropout: float = 0.0
    max_weight: float | None = None

    @property
    def step(self) -> float:
        return 2 * self.clip_range / self.levels

    @property
    def bits(self) -> int:
        return self.modulus.bit_length() - 1

    def degree(self, n: int) -> int:
        return n - 1 if self.neighbours is None else min(self.neighbours, n - 1)

    def t(self, n: int) -> int:
        holders = self.degree(n) + 1
        return min(holders, self.threshold) if self.threshold is not None else holders // 2 + 1

    def check_overflow(self, n: int) -> None:
        """SecAggFailure where n quantised values of at most L could sum past M."""
        if n * self.levels >= self.modulus:
            raise SecAggFailure(
                f"secure aggregation of {n} clients overflows: n·L = {n}·{self.levels} ≥ modulus "
                f"{self.modulus} (raise aggregator.secagg_modulus or lower aggregator.secagg_levels)"
            )


def quantize(x: torch.Tensor, p: SecAggParams, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """x (float64) clipped to [−c, c], mapped to [0, L] and rounded stochastically (up with
    probability the fraction: unbiased), with the uniforms from `gen` (never global state).
    Returns the integers (int64) and how many coordinates were clipped."""
    c = p.clip_range
    clipped = int((x.abs() > c).sum())
    y = (x.clamp(-c, c) + c) * (p.levels / (2 * c))
    low = y.floor()
    up = torch.rand(y.shape, generator=gen, dtype=torch.float64) < (y - low)
    return (low + up.to(torch.float64)).to(torch.int64).clamp_(0, p.levels), clipped


def dequantize(total: torch.Tensor, count: int, p: SecAggParams) -> torch.Tensor:
    """The sum of `count` clients' quantised values back to the sum of their inputs (float64):
    each maps q to q·2c/L − c."""
    return total.to(torch.float64) * p.step - count * p.clip_range


def prg(seed: bytes, n: int, bits: int) -> torch.Tensor:
    """n integers in [0, 2^bits) (int64) expanded from a 32-byte seed by AES-256-CTR: a
    cryptographic PRG, the same stream on every machine."""
    width = 4 if bits <= 32 else 8
    enc = Cipher(algorithms.AES(seed), modes.CTR(b"\0" * 16)).encryptor()
    stream = enc.update(b"\0" * (n * width)) + enc.finalize()
    dt = np.dtype("<u4") if width == 4 else np.dtype("<u8")
    words = np.frombuffer(stream, dtype=dt).astype(np.uint64) & np.uint64((1 << bits) - 1)
    return torch.from_numpy(words.astype(np.int64))


def _kdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def _raw(pk: X25519PublicKey) -> bytes:
    return pk.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# ---------------------------------------------------------------------------------------------
# Shamir secret sharing over GF(2^521 − 1)


def shamir_split(
    secret: bytes, t: int, holders: Sequence[int], coefficients: Sequence[int]
) -> dict[int, int]:
    """Shares of `secret` (≤ 65 bytes) for `holders` (share x = holder + 1), any t of which
    rebuild it: f(x) = secret + a_1 x + … + a_{t−1} x^{t−1} mod p, the a_i given (random)."""
    if not 1 <= t <= len(holders):
        raise ValueError(f"a threshold of {t} among {len(holders)} holders")
    if len(coefficients) != t - 1:
        raise ValueError(f"a threshold of {t} takes {t - 1} random coefficients")
    poly = [int.from_bytes(secret, "big"), *(a % PRIME for a in coefficients)]
    out = {}
    for h in holders:
        x, acc = h + 1, 0
        for a in reversed(poly):
            acc = (acc * x + a) % PRIME
        out[h] = acc
    return out


def shamir_combine(shares: dict[int, int], t: int, length: int = KEY_BYTES) -> bytes:
    """The secret from ≥ t shares (holder -> share): Lagrange interpolation at 0 over t of
    them. ShamirError with fewer: t − 1 shares are consistent with every secret."""
    if len(shares) < t:
        raise ShamirError(f"{len(shares)} shares, threshold {t}")
    pts = sorted(shares.items())[:t]
    secret = 0
    for i, (hi, yi) in enumerate(pts):
        num, den = 1, 1
        for j, (hj, _) in enumerate(pts):
            if i != j:
                num = num * (-(hj + 1)) % PRIME
                den = den * ((hi + 1) - (hj + 1)) % PRIME
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    if secret >= 1 << (8 * length):
        raise ShamirError("the shares do not rebuild a secret of this length")
    return secret.to_bytes(length, "big")


def harary_graph(ids: Sequence[ClientId], k: int, gen: torch.Generator) -> dict[ClientId, list[ClientId]]:
    """Each client's k neighbours: a ring over a seeded permutation of `ids`, k/2 each side
    (SecAgg+'s Harary graph); k ≥ n − 1: every other client."""
    ids = sorted(ids)
    n = len(ids)
    if k >= n - 1:
        return {u: [v for v in ids if v != u] for u in ids}
    order = [ids[i] for i in torch.randperm(n, generator=gen).tolist()]
    pos = {u: i for i, u in enumerate(order)}
    half = k // 2
    return {u: sorted(order[(pos[u] + d) % n] for d in range(-half, half + 1) if d != 0) for u in ids}


# ---------------------------------------------------------------------------------------------
# The parties


@dataclass(frozen=True)
class PublicKeys:
    """What a client advertises: its share-encryption and mask-agreement public keys."""

    enc: bytes
    mask: bytes


@dataclass(frozen=True)
class ShareRequest:
    """The server's stage-3 message to a survivor: who survived, who dropped, and the
    ciphertexts addressed to it."""

    survivors: frozenset[ClientId]
    dropped: frozenset[ClientId]
    inbox: dict[ClientId, bytes]


class SecAggClient:
    """One client's side of the protocol: its keys and secrets stay in this object; the server
    sees only what its methods return."""

    def __init__(self, client_id: ClientId, rnd: int, p: SecAggParams, ctx: ServerContext) -> None:
        self.id, self.round, self.p = client_id, rnd, p
        self._ctx = ctx
        self._enc_sk = X25519PrivateKey.from_private_bytes(self._bytes(1, KEY_BYTES))
        self._mask_sk_bytes = self._bytes(2, KEY_BYTES)
        self._mask_sk = X25519PrivateKey.from_private_bytes(self._mask_sk_bytes)
        self._b = self._bytes(3, KEY_BYTES)  # the self-mask seed
        self._roster: dict[ClientId, PublicKeys] = {}
        self._neighbours: list[ClientId] = []
        self._holders: list[ClientId] = []
        self._aeads: dict[ClientId, AESGCM] = {}
        self._answered = False

    def _gen(self, purpose: int) -> torch.Generator:
        return self._ctx.generator(step_tag("secagg_plus"), self.id, purpose)

    def _bytes(self, purpose: int, n: int) -> bytes:
        g = self._gen(purpose)
        return bytes(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).tolist())

    # stage 0
    def public_keys(self) -> PublicKeys:
        return PublicKeys(_raw(self._enc_sk.public_key()), _raw(self._mask_sk.public_key()))

    def _aead(self, other: ClientId) -> AESGCM:
        if other not in self._aeads:  # agreed once, used to encrypt (stage 1) and decrypt (3)
            pk = X25519PublicKey.from_public_bytes(self._roster[other].enc)
            self._aeads[other] = AESGCM(_kdf(self._enc_sk.exchange(pk), b"fl_lightning secagg+ shares"))
        return self._aeads[other]

    def _nonce(self, sender: ClientId, receiver: ClientId) -> bytes:
        return struct.pack(">III", sender, receiver, self.round)

    # stage 1
    def share_keys(
        self, roster: dict[ClientId, PublicKeys], neighbours: Sequence[ClientId], t: int
    ) -> dict[ClientId, bytes]:
        """Shares of b_u and of the mask secret key for each neighbour and itself, each
        encrypted to its holder (the server routes even u's own, which it cannot read)."""
        self._roster, self._neighbours = {**roster, self.id: self.public_keys()}, sorted(neighbours)
        self._holders = sorted({*self._neighbours, self.id})  # its own share too (SecAgg's "all")
        g = self._gen(4)

        def coefficients() -> list[int]:
            raw = torch.randint(0, 256, (t - 1, SHARE_BYTES), generator=g, dtype=torch.uint8)
            return [int.from_bytes(bytes(r.tolist()), "big") for r in raw]

        b_shares = shamir_split(self._b, t, self._holders, coefficients())
        sk_shares = shamir_split(self._mask_sk_bytes, t, self._holders, coefficients())
        out = {}
        for v in self._holders:
            plain = struct.pack(">II", self.id, v) + b_shares[v].to_bytes(SHARE_BYTES, "big")
            plain += sk_shares[v].to_bytes(SHARE_BYTES, "big")
            out[v] = self._aead(v).encrypt(self._nonce(self.id, v), plain, b"secagg+")
        return out

    # stage 2
    def masked_input(self, x: torch.Tensor) -> torch.Tensor:
        """y = x + PRG(b_u) + Σ_v ±PRG(s_uv) mod M (x: int64 in [0, M))."""
        bits, mask = self.p.bits, self.p.modulus - 1
        y = (x + prg(self._b, x.numel(), bits)) & mask
        for v in self._neighbours:
            s = pair_seed(self._mask_sk, self._roster[v].mask)
            m = prg(s, x.numel(), bits)
            y = (y + m if self.id < v else y - m) & mask
        return y

    # stage 3
    def reveal(self, req: ShareRequest) -> dict[ClientId, tuple[str, int]]:
        """For each neighbour that shared with u: its self-mask seed's share if it survived,
        its mask key's share if it dropped. Once a round, and never both for one client (the
        two together would unmask its update)."""
        if self._answered:
            raise RuntimeError(f"client {self.id} already revealed its shares this round")
        if req.survivors & req.dropped:
            raise RuntimeError("a client cannot have both survived and dropped")
        self._answered = True
        out: dict[ClientId, tuple[str, int]] = {}
        for owner, ct in sorted(req.inbox.items()):
            if owner not in self._holders:
                continue
            plain = self._aead(owner).decrypt(self._nonce(owner, self.id), ct, b"secagg+")
            o, h = struct.unpack(">II", plain[:8])
            if (o, h) != (owner, self.id):
                raise RuntimeError(f"client {self.id} got a share addressed to ({o}, {h})")
            b = int.from_bytes(plain[8 : 8 + SHARE_BYTES], "big")
            sk = int.from_bytes(plain[8 + SHARE_BYTES :], "big")
            if owner in req.survivors:
                out[owner] = ("b", b)
            elif owner in req.dropped:
                out[owner] = ("sk", sk)
        return out


def pair_seed(sk: X25519PrivateKey, other_mask_pk: bytes) -> bytes:
    """s_uv: the pairwise mask's PRG seed, HKDF of the X25519 agreement (the same from both ends)."""
    shared = sk.exchange(X25519PublicKey.from_public_bytes(other_mask_pk))
    return _kdf(shared, b"fl_lightning secagg+ mask")


class SecAggServer:
    """The server's side: routes messages, sums masked inputs mod M, and unmasks only the sum.
    It never holds a client's secret, nor its input."""

    def __init__(self, rnd: int, p: SecAggParams, graph_gen: torch.Generator) -> None:
        self.round, self.p, self._gen = rnd, p, graph_gen
        self.roster: dict[ClientId, PublicKeys] = {}
        self.graph: dict[ClientId, list[ClientId]] = {}
        self.t = 0
        self.mailbox: dict[ClientId, dict[ClientId, bytes]] = {}  # receiver -> sender -> ciphertext
        self.total: torch.Tensor | None = None
        self.survivors: set[ClientId] = set()
        self.endpoints: dict[ClientId, SecAggClient] = {}  # how to reach a client in stage 3
        self.layout: Layout | None = None  # which tensors the vector holds (public: the method's)
        self.bytes_down = 0  # what the server sends: rosters, routed ciphertexts, requests
        self.clients_s = 0.0  # seconds the clients spent answering stage 3 (a benchmark's split)
        self.bytes_up = 0  # what the survivors send in stage 3 (their revealed shares)

    def advertise(self, keys: dict[ClientId, PublicKeys]) -> None:
        """Stage 0 ends: the roster, the graph and the threshold for this cohort."""
        n = len(keys)
        self.p.check_overflow(n)
        self.roster = dict(keys)
        k = self.p.degree(n)
        self.t = self.p.t(n)
        if n < 2 or self.t < 1:
            raise SecAggFailure(f"round {self.round}: secure aggregation needs at least 2 clients (got {n})")
        self.graph = harary_graph(list(keys), k, self._gen)
        self.bytes_down += sum(64 * len(v) for v in self.graph.values())

    def neighbours_of(self, u: ClientId) -> tuple[dict[ClientId, PublicKeys], list[ClientId]]:
        return {v: self.roster[v] for v in self.graph[u]}, self.graph[u]

    def receive_shares(self, sender: ClientId, cts: dict[ClientId, bytes]) -> None:
        for v, ct in cts.items():
            self.mailbox.setdefault(v, {})[sender] = ct
            self.bytes_down += len(ct)

    def receive_masked(self, sender: ClientId, y: torch.Tensor) -> None:
        mask = self.p.modulus - 1
        self.total = y.clone() if self.total is None else (self.total + y) & mask
        self.survivors.add(sender)

    def unmask(self) -> torch.Tensor:
        """Stage 3: Σ_{u survived} x_u mod M. SecAggFailure below the threshold."""
        if self.total is None or not self.survivors:
            raise SecAggFailure(f"round {self.round}: no client sent its masked input")
        survivors = frozenset(self.survivors)
        dropped = frozenset(set(self.roster) - survivors)
        revealed: dict[ClientId, dict[ClientId, int]] = {}  # owner -> holder -> share
        for v in sorted(survivors):
            inbox = self.mailbox.get(v, {})
            req = ShareRequest(survivors, dropped, inbox)
            self.bytes_down += 4 * len(self.roster)  # who survived, who dropped (the ciphertexts: stage 1)
            t0 = time.perf_counter()
            answer = self.endpoints[v].reveal(req)
            self.clients_s += time.perf_counter() - t0  # the survivors' work, not the server's
            self.bytes_up += len(answer) * (4 + SHARE_BYTES)
            for owner, (_, share) in answer.items():
                revealed.setdefault(owner, {})[v] = share
        mask, bits, n = self.p.modulus - 1, self.p.bits, self.total.numel()
        total = self.total

        def rebuild(owner: ClientId, what: str) -> bytes:
            shares = revealed.get(owner, {})
            try:
                return shamir_combine(shares, self.t)
            except ShamirError:
                raise SecAggFailure(
                    f"round {self.round}: secure aggregation cannot unmask the sum: client {owner}'s "
                    f"{what} has {len(shares)} share{'' if len(shares) == 1 else 's'} among the "
                    f"{len(survivors)} survivors, threshold "
                    f"{self.t} ({len(dropped)} of {len(self.roster)} clients dropped after sharing)"
                ) from None

        for u in sorted(survivors):
            total = (total - prg(rebuild(u, "self-mask seed"), n, bits)) & mask
        for v in sorted(dropped):
            sk = X25519PrivateKey.from_private_bytes(rebuild(v, "mask key"))
            for u in self.graph[v]:
                if u in survivors:  # u added +PRG(s_uv) if u < v, else −PRG(s_uv)
                    m = prg(pair_seed(sk, self.roster[u].mask), n, bits)
                    total = (total - m if u < v else total + m) & mask
        return total


# ---------------------------------------------------------------------------------------------
# On the seam: the masked update, the step, the aggregator


@dataclass
class MaskedUpdate(ClientUpdate):
    """A client's upload under secure aggregation: no params, its masked input (None: it
    dropped after sharing its keys) and the metadata the server may see.

    Attributes:
        masked: y_u mod M (int64), the client's whole encoded update masked.
        keys: its public keys (stage 0).
        shares: its encrypted shares, by the neighbour they are for (stage 1).
    """

    masked: torch.Tensor | None = None
    keys: PublicKeys | None = None
    shares: dict[ClientId, bytes] = field(default_factory=dict)
    modulus_bits: int = 32

    def upload_nbytes(self) -> int:
        """The bytes a real client sends: keys, ciphertexts, and log2(M) bits per coordinate
        (stored here as int64 for the arithmetic)."""
        n = 0 if self.masked is None else math.ceil(self.masked.numel() * self.modulus_bits / 8)
        return n + (64 if self.keys is not None else 0) + sum(len(c) for c in self.shares.values())


@dataclass
class Layout:
    """How an update's tensors lie in the masked vector: quantised floats, then integer buffers
    (their weighted deltas, exact), then the weight and the clipped count (exact)."""

    floats: list[tuple[str, torch.Size]]
    ints: list[tuple[str, torch.Size]]

    @property
    def n_floats(self) -> int:
        return sum(math.prod(s) for _, s in self.floats)

    @property
    def size(self) -> int:
        return self.n_floats + sum(math.prod(s) for _, s in self.ints) + 2


def layout_of(base: StateDict) -> Layout:
    floats = [(k, v.shape) for k, v in base.items() if v.is_floating_point()]
    ints = [(k, v.shape) for k, v in base.items() if not v.is_floating_point()]
    return Layout(floats, ints)


@register_step("secagg_plus")
@dataclass(frozen=True)
class SecAggPlus(AggregationStep):
    """Secure aggregation: the steps before it run on each client (clipping, weights, the
    client's share of noise), then the update is quantised and masked; the server sums and
    unmasks; the steps after it see only the mean. The chain becomes a `SecureAggregator`."""

    params: SecAggParams = SecAggParams()

    @classmethod
    def from_config(cls, cfg: Any) -> SecAggPlus:
        a = cfg.aggregator
        return cls(
            SecAggParams(
                clip_range=float(a.secagg_clip_range),
                levels=int(a.secagg_levels),
                modulus=int(a.secagg_modulus),
                neighbours=None if a.secagg_neighbours is None else int(a.secagg_neighbours),
                threshold=None if a.secagg_threshold is None else int(a.secagg_threshold),
                dropout=float(a.secagg_dropout),
                max_weight=None if a.secagg_max_weight is None else float(a.secagg_max_weight),
            )
        )

    def build(self, steps: tuple[AggregationStep, ...]) -> Aggregator:
        return SecureAggregator(steps)

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        raise RuntimeError("secagg_plus never sees a single update on the server")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self.params)}


@register_step("distributed_gaussian")
@dataclass(frozen=True)
class DistributedGaussian(AggregationStep):
    """Each client's share of the Gaussian noise of a secure sum (distributed DP): N(0, σ²C²/m)
    per coordinate on its clipped delta, before it is quantised, so the sum of m clients
    carries N(0, σ²C²) (the `gaussian` step's σC/m on the mean) and the server never sees a
    noiseless sum. m: the round's planned cohort; d clients that drop take their share with them
    (the sum's variance is then (m − d)/m of the target). Drawn from (seed, round, client)."""

    noise_multiplier: float = 0.0
    clip: float = 1.0
    cohort: int = 1

    @classmethod
    def from_config(cls, cfg: Any) -> DistributedGaussian:
        # the cohort: set by the build from the run's clients a round (`runtime/build.py`)
        return cls(float(cfg.aggregator.noise_multiplier), float(cfg.aggregator.clip), 0)

    def std(self) -> float:
        if self.cohort < 1:
            raise ValueError("distributed_gaussian needs the round's cohort (build_aggregator sets it)")
        return self.noise_multiplier * self.clip / math.sqrt(self.cohort)

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        if self.noise_multiplier == 0.0:
            return c
        if ctx is None:
            raise RuntimeError("distributed_gaussian needs the round's ServerContext (its generator)")
        std, gen = self.std(), ctx.generator(step_tag(self.name), c.client_id)
        values = {
            k: v + std * torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in c.values.items()
        }
        return dataclasses.replace(c, values=values)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "cohort": self.cohort,
        }


@dataclass
class SecureAccumulator(Accumulator):
    server: SecAggServer | None = None
    layout: Layout | None = None


class SecureAggregator(Aggregator):
    """The chain with a `secagg_plus` step: `upload` plays the clients (each masks its own
    update from its own keys), `add`/`result` the server, which holds only the masked inputs
    and the revealed shares (module docstring)."""

    def __init__(self, steps: Sequence[AggregationStep] = ()) -> None:
        super().__init__(steps)
        names = [s.name for s in self.steps]
        i = names.index("secagg_plus")
        step = self.steps[i]
        assert isinstance(step, SecAggPlus)
        self.p = step.params
        self.client_steps = self.steps[:i]  # run by each client on its own update
        for s in self.steps[i + 1 :]:  # the server has no single update to give them
            if type(s).one is not AggregationStep.one:
                raise ConfigError(
                    f"aggregation step {s.name} reads each update, so it must come before secagg_plus "
                    "(each client applies it to its own update)"
                )
        #: the round's server, from `upload` to `result` (the protocol's transient session)
        self._sessions: dict[int, SecAggServer] = {}
        #: the round's cohort (the bound an exact coordinate must keep below M/2 summed)
        self.n_max = 1

    @property
    def on_deltas(self) -> bool:
        return True

    def max_weight(self) -> float:
        if any(s.name == "uniform" for s in self.client_steps):
            return 1.0
        if self.p.max_weight is None:
            raise ValueError("secagg_plus needs max_weight (set from the run's largest client by the build)")
        return self.p.max_weight

    def encode(
        self, update: ClientUpdate, base: StateDict, ctx: ServerContext
    ) -> tuple[torch.Tensor, Layout]:
        """The client's side of the encoding: its delta through the client steps (clip,
        weights, noise), times w/max_weight, quantised; integer buffers' w·Δ, w and the
        clipped count exact; all as int64 in [0, M)."""
        assert update.params is not None
        lay = layout_of({k: base[k] for k in base if k in update.params})
        deltas = {
            k: update.params[k].detach().to("cpu", torch.float64) - base[k].detach().to("cpu", torch.float64)
            for k, _ in lay.floats
        }
        c = Contribution(update.client_id, float(update.num_examples), deltas)
        for s in self.client_steps:
            c = s.one(c, {}, ctx)
        w = c.weight
        if w < 0 or w != int(w):
            raise ValueError(f"secure aggregation sums integer weights (client {c.client_id}: {w})")
        ratio = w / self.max_weight()
        flat = torch.cat([c.values[k].reshape(-1) for k, _ in lay.floats]) * ratio
        gen = ctx.generator(step_tag("secagg_plus"), update.client_id, 0)
        q, clipped = quantize(flat, self.p, gen)
        mod = self.p.modulus
        ints = [
            (update.params[k].to("cpu", torch.int64) - base[k].to("cpu", torch.int64)).reshape(-1) * int(w)
            for k, _ in lay.ints
        ]
        exact = torch.cat([*ints, torch.tensor([int(w), clipped], dtype=torch.int64)])
        if int(exact.abs().max()) * self.n_max >= mod // 2:
            raise SecAggFailure(
                f"client {update.client_id}: an exact coordinate (weight, integer buffer) of "
                f"{int(exact.abs().max())} would overflow a sum of {self.n_max} mod {mod}"
            )
        return torch.cat([q, exact]) & (mod - 1), lay

    def upload(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> list[ClientUpdate]:
        """Stages 0-2: each client of the round (in client-id order) masks its own update; the
        server routes keys and shares. A seeded `dropout` fraction drops after sharing."""
        if ctx is None:
            raise RuntimeError("secure aggregation needs the round's ServerContext (its generators)")
        base = state.global_params
        ups = sorted(updates, key=lambda u: u.client_id)
        if base is None or not any(u.params for u in ups):
            return list(ups)
        cohort = [u for u in ups if u.params]
        base_fields = {f.name for f in dataclasses.fields(ClientUpdate)}
        for u in cohort:  # a method's own upload fields would reach the server in the clear
            extra = [f.name for f in dataclasses.fields(u) if f.name not in base_fields]
            if extra:
                raise ValueError(
                    f"secagg_plus: client {u.client_id}'s upload carries {', '.join(extra)} beside its "
                    f"params, which the server would read one by one (declare the method's "
                    f"reads_each_update so such a run is refused before it starts)"
                )
        keys = {frozenset(u.params or {}) for u in cohort}
        if len(keys) != 1:  # the vector's layout is public: every client sends the same tensors
            raise ValueError("secure aggregation needs every client to upload the same tensors")
        server = SecAggServer(ctx.round, self.p, ctx.generator(step_tag("secagg_plus"), SERVER, 1))
        self.n_max = len(cohort)
        clients = {u.client_id: SecAggClient(u.client_id, ctx.round, self.p, ctx) for u in cohort}
        server.advertise({cid: c.public_keys() for cid, c in clients.items()})
        shares = {}
        for cid, c in clients.items():
            shares[cid] = c.share_keys(*server.neighbours_of(cid), server.t)
            server.receive_shares(cid, shares[cid])
        n_drop = round(self.p.dropout * len(cohort))
        order = torch.randperm(len(cohort), generator=ctx.generator(step_tag("secagg_plus"), SERVER, 2))
        dropped = {cohort[i].client_id for i in order[:n_drop].tolist()}
        out: list[ClientUpdate] = []
        for u in ups:
            if not u.params:
                out.append(u)
                continue
            c = clients[u.client_id]
            server.endpoints[u.client_id] = c
            masked = None
            if u.client_id not in dropped:
                x, _ = self.encode(u, base, ctx)
                masked = c.masked_input(x)
            fields = {f.name: getattr(u, f.name) for f in dataclasses.fields(ClientUpdate)}
            out.append(
                MaskedUpdate(
                    **{**fields, "params": None},
                    masked=masked,
                    keys=c.public_keys(),
                    shares=shares[u.client_id],
                    modulus_bits=self.p.bits,
                )
            )
        server.layout = layout_of({k: base[k] for k in base if k in next(iter(keys))})
        self._sessions[ctx.round] = server
        return out

    def after(self, step: AggregationStep) -> Aggregator:
        if any(s.name == step.name for s in self.steps):
            return self
        return SecureAggregator((step, *self.steps))

    def start(self, state: ServerState, ctx: ServerContext | None = None) -> Accumulator:
        if ctx is None or ctx.round not in self._sessions:
            raise RuntimeError(
                "secure aggregation: this round's updates were not masked by their clients "
                "(Aggregator.upload runs after the fit, before the strategy aggregates)"
            )
        memory = {s.name: dict(state.aggregation.get(s.name, {})) for s in self.steps}
        assert state.global_params is not None
        server = self._sessions[ctx.round]
        return SecureAccumulator(base=state.global_params, memory=memory, server=server, layout=server.layout)

    def add(self, acc: Accumulator, update: ClientUpdate, ctx: ServerContext | None = None) -> Accumulator:
        assert isinstance(acc, SecureAccumulator) and acc.server is not None
        if update.params:
            raise RuntimeError(f"secure aggregation received client {update.client_id}'s unmasked update")
        if update.client_id <= acc.last_client:
            raise ValueError("updates must be added in increasing client-id order")
        acc.last_client = update.client_id
        if isinstance(update, MaskedUpdate) and update.masked is not None:
            acc.server.receive_masked(update.client_id, update.masked)
            acc.count += 1
        return acc

    def result(
        self, acc: Accumulator, state: ServerState, ctx: ServerContext | None = None
    ) -> tuple[StateDict | None, dict[str, dict[str, Any]], Metrics]:
        assert isinstance(acc, SecureAccumulator) and acc.server is not None and acc.layout is not None
        server, lay, p = acc.server, acc.layout, self.p
        if ctx is not None:
            self._sessions.pop(ctx.round, None)
        total = server.unmask()
        n = len(server.survivors)
        nf = lay.n_floats
        signed = torch.where(total >= p.modulus // 2, total - p.modulus, total)
        weight = float(signed[-2])
        if weight <= 0:
            raise SecAggFailure(f"round {server.round}: the surviving clients' total weight is {weight}")
        mean_flat = dequantize(total[:nf], n, p) * (self.max_weight() / weight)
        base = acc.base or {}
        values: StateDict = {}
        i = 0
        for k, shape in lay.floats:
            size = math.prod(shape)
            values[k] = mean_flat[i : i + size].reshape(shape)
            i += size
        metrics: Metrics = {
            "secagg_plus/survivors": float(n),
            "secagg_plus/dropped": float(len(server.roster) - n),
            "secagg_plus/clipped": float(signed[-1]) / max(n * nf, 1),
            "secagg_plus/threshold": float(server.t),
        }
        agg = Aggregate(values, n, weight, metrics)
        for s in reversed(self.steps):
            if s.name != "secagg_plus":
                agg = s.server(agg, acc.memory[s.name], ctx)
        out: StateDict = {}
        for k, _ in lay.floats:
            out[k] = (base[k].detach().to(torch.float64) + agg.values[k]).to(base[k].dtype)
        j = nf
        for k, shape in lay.ints:
            size = math.prod(shape)
            mean = signed[j : j + size].to(torch.float64) / weight
            out[k] = (base[k].to(torch.float64) + mean.reshape(shape)).round().to(base[k].dtype)
            j += size
        return {**(state.global_params or {}), **out}, acc.memory, {**agg.metrics}
