"""CoOp-style class-specific soft prompts over a frozen `TextEncoder` (FedTSP's prompt learner).

    sp = ClassSoftPrompts(encoder, class_names, descriptions=descs, ctx_init="a photo of a")
    feats = sp()                  # [C, k, d]: prompt "a photo of a {class}: {description_j}."
    feats = sp(reduce="mean")     # [C, d], averaged over the k descriptions, re-normalised

Each class owns `m` trainable vectors (`sp.ctx`, [C, m, h]; m = the number of tokens of
`ctx_init`) that replace the first m content-token embeddings of all that class's k prompts
(the leading [CLS] / <start_of_text> stays in place). `class_token_position` moves the class
name's tokens as CoOp does: `end` "<ctx> {class}.", `front` "{class} <ctx>.", `middle`
"<ctx[:m//2]> {class} <ctx[m//2:]>.". They start as the token embeddings of
`ctx_init`, so an untrained module reproduces the handcrafted prompts' features. The encoder is
a frozen submodule (`sp.encoder`): `sp.to(dev)` moves it as any submodule, none of its weights
takes a gradient (`TextEncoder` freezes them and stays in eval mode), and its state entries
(`encoder.*`) are frozen by role (`frozen_prefixes`, read by `ClientObjective.role` through the
model holding the prompts): never trained, uploaded, broadcast or checkpointed. Only `ctx` trains.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .encoders import TextEncoder
from .prompts import clean_class_name

#: where the class name sits in the prompt (CoOp's CLASS_TOKEN_POSITION)
POSITIONS = ("end", "middle", "front")


class ClassSoftPrompts(nn.Module):
    #: the state entries frozen by role, below this module (a model holding it at `prompt.`
    #: names them `prompt.encoder.`)
    frozen_prefixes: tuple[str, ...] = ("encoder.",)

    encoder: TextEncoder  # a frozen submodule (see the module docstring)
    token_embeds: Tensor  # buffers, set in __init__
    attention_mask: Tensor
    class_index: Tensor

    def __init__(
        self,
        encoder: TextEncoder,
        class_names: Sequence[str],
        descriptions: Sequence[Sequence[str]] | None = None,
        ctx_init: str | None = "a photo of a",
        n_ctx: int | None = None,
        class_specific: bool = True,
        init_std: float = 0.02,
        class_token_position: str = "end",
    ) -> None:
        """`descriptions`: k strings per class (same k for all); without them k = 1 and the
        prompt is "<ctx> {class}.". `ctx_init=None` with `n_ctx=m` starts from N(0, init_std)
        vectors (CoOp's random init; placeholders "X" are tokenised in their place).
        `class_specific=False` shares one set of m vectors across all classes."""
        super().__init__()
        if class_token_position not in POSITIONS:
            raise ValueError(
                f"class_token_position={class_token_position!r}: expected one of {', '.join(POSITIONS)}"
            )
        self.encoder = encoder  # a submodule, frozen by role (`frozen_prefixes`)
        if ctx_init is not None:
            ctx_text = ctx_init
        elif n_ctx:
            ctx_text = " ".join(["X"] * int(n_ctx))
        else:
            raise ValueError("give ctx_init (a handcrafted context) or n_ctx (random init)")
        ids, ctx_mask = encoder.tokenize([ctx_text])
        p = encoder.prefix_tokens
        m = int(ctx_mask.sum()) - p - encoder.suffix_tokens
        if n_ctx is not None and ctx_init is not None and n_ctx != m:
            raise ValueError(f"ctx_init {ctx_init!r} has {m} tokens, but n_ctx={n_ctx}")
        self.n_ctx, self.class_names = m, [str(c) for c in class_names]
        C = len(self.class_names)
        if descriptions is None:
            rests = [[f"{clean_class_name(c)}."] for c in self.class_names]
        else:
            if len(descriptions) != C:
                raise ValueError(f"{C} classes but {len(descriptions)} description lists")
            rests = [
                [f"{clean_class_name(c)}: {d.rstrip('.')}." for d in ds]
                for c, ds in zip(self.class_names, descriptions, strict=True)
            ]
        ks = {len(r) for r in rests}
        if len(ks) != 1:
            raise ValueError(f"every class needs the same number of descriptions (got {sorted(ks)})")
        self.k = ks.pop()
        self.prompts = [[f"{ctx_text} {r}" for r in rs] for rs in rests]  # the handcrafted equivalents
        flat = [t for ts in self.prompts for t in ts]
        all_ids, mask = encoder.tokenize(flat)
        ctx_ids = ids[0, p : p + m]
        if not torch.equal(all_ids[:, p : p + m], ctx_ids.expand(len(flat), m)):
            raise ValueError(
                f"the context {ctx_text!r} does not tokenise to the same tokens inside every prompt"
            )
        with torch.no_grad():
            embeds = encoder.embed_tokens(all_ids).detach()
            init = encoder.embed_tokens(ctx_ids[None])[0].detach().float()  # [m, h]
        if ctx_init is None:
            init = torch.randn_like(init) * init_std
        shape = (C, m, init.shape[-1]) if class_specific else (m, init.shape[-1])
        self.ctx = nn.Parameter(init.expand(shape).clone())
        self.class_specific = class_specific
        self.class_token_position = class_token_position
        # tokens of each prompt's class name (CoOp's name_lens), for front / middle
        _, name_mask = encoder.tokenize([clean_class_name(c) for c in self.class_names])
        lens = name_mask.sum(1) - p - encoder.suffix_tokens
        self.name_lens = [int(n) for n in lens.repeat_interleave(self.k)]
        self.register_buffer("token_embeds", embeds, persistent=False)  # [C*k, L, h], frozen
        self.register_buffer("attention_mask", mask, persistent=False)
        self.register_buffer("class_index", torch.arange(C).repeat_interleave(self.k), persistent=False)

    def embeddings(self, classes: Tensor | None = None, ctx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The prompts' embedding sequences [n, L, h] with the class vectors spliced in, and masks;
        `ctx`: context vectors from outside in `self.ctx`'s place, [m, h] shared by the classes
        (FedTPG's generated one) or [C, m, h] one per class (FedPGP's σ + U V, class-specific)."""
        rows = torch.arange(len(self.class_index), device=self.token_embeds.device)
        if classes is not None:
            classes = torch.as_tensor(classes, device=rows.device)
            rows = rows[torch.isin(self.class_index, classes)]
        base, p, m = self.token_embeds[rows], self.encoder.prefix_tokens, self.n_ctx
        ctx = self.ctx if ctx is None else ctx
        n = len(rows)
        ctx = ctx[self.class_index[rows]] if ctx.dim() == 3 else ctx.unsqueeze(0).expand(n, -1, -1)
        ctx = ctx.to(base.dtype)
        if self.class_token_position == "end":
            x = torch.cat([base[:, :p], ctx, base[:, p + m :]], dim=1)
        else:  # per prompt, as CoOp: class names differ in length
            half = m // 2 if self.class_token_position == "middle" else 0
            parts = []
            for i, r in enumerate(rows.tolist()):
                n, b = self.name_lens[r], base[i]
                name, rest = b[p + m : p + m + n], b[p + m + n :]
                parts.append(torch.cat([b[:p], ctx[i, :half], name, ctx[i, half:], rest]))
            x = torch.stack(parts)
        return x, self.attention_mask[rows]

    def forward(
        self, reduce: str = "none", classes: Tensor | None = None, ctx: Tensor | None = None
    ) -> Tensor:
        """Features [C, k, d] (`reduce="none"`) or [C, d] (`"mean"`, re-normalised); with
        `classes`, only those classes (sorted), e.g. the labels present in a batch; `ctx`: see
        `embeddings`."""
        x, mask = self.embeddings(classes, ctx)
        feats = self.encoder.forward_embeddings(x, mask)
        feats = feats.float() if feats.dtype in (torch.float16, torch.bfloat16) else feats  # float64 stays
        feats = feats.view(-1, self.k, feats.shape[-1])
        if reduce == "mean":
            return F.normalize(feats.mean(1), dim=-1)
        if reduce != "none":
            raise ValueError(f"reduce={reduce!r}: expected none or mean")
        return feats

    def extra_repr(self) -> str:
        return (
            f"classes={len(self.class_names)}, k={self.k}, n_ctx={self.n_ctx}, encoder={self.encoder.name!r}"
        )
