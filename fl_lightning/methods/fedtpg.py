"""FedTPG: Qiu et al., "Text-driven Prompt Generation for Vision-Language Models in Federated
Learning", ICLR 2024, https://openreview.net/forum?id=NW31gAylIm.

PromptFL with the context generated, not learned: a prompt generator shared by all clients
(`models/prompt_generator.py`: learnable queries cross-attending to the frozen text tower's
features of the class names) maps the names of the classes scored together to one context of
`n_ctx` vectors, and "[ctx] {class}." goes through the frozen text tower as in CoOp. Each
client trains the generator on its own classes (`data.partition=class_blocks`: FedTPG's
`num_cls_per_client`), scoring only those (its labels relabelled, its names the generator's
input); the server averages the generators. Since the context comes from the names, classes
no client held get one too: evaluation scores all classes with the context generated from all
their names, and under `data.base_new` the base and the new classes each with their own; in a
composite of datasets (`data=coop_multi`, the authors' cross-class run over nine) each dataset's
classes with their own, its base and its new apart (the authors' `Server.test` scores a dataset
with its own class names).

Authors' code (github:boschresearch/FedTPG @f141c29): `model/FedTPG.py` (`FedTPG.forward`:
the bare class names encoded and normalised, `PromptLearner`, the context spliced after the
start token of "X X X X {name}."), `model/prompt_net.py` (the generator),
`federated/client.py` (one pass over the client's data per round, logits over its
`available_classes`), `federated/server.py` (`train`: a plain mean of the selected clients'
`prompt_learner` state; `test`: base and new each scored with their own names),
`Launch_FL.py` / `config/defaults.py` (n_ctx 4, depth 0, SGD 0.003, momentum 0.9, weight
decay 1e-5, batch 200, 500 rounds). Their nine datasets in one run: `data=coop_multi`. Where
we differ: Dassl's cosine schedule, fp16 and CLIP's training augmentation are left out
(constant rate, float32, clean images), as for PromptFL.
"""

from __future__ import annotations

from typing import Any

from ..core.metrics import base_new_sets
from .configs.fedtpg import FedTPGConfig
from .promptfl import PromptFL


class FedTPG(PromptFL):
    config_cls = FedTPGConfig  # its clients: PromptFL's, scoring their own classes (own_classes)

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        c: Any = self.config
        spec = self.eval_spec()
        generator = {"depth": c.depth, "heads": c.heads, "template": c.template,
                     "base_classes": spec.base_classes}  # fmt: skip
        if self.task.class_sets:  # a composite: each dataset's names apart, its base and new apart
            sets = base_new_sets(self.task.num_classes, self.task.class_sets)
            inner = [mid for _, _, mid, _ in sets] if spec.base_new_sets else []
            generator["cuts"] = sorted({0, *inner, *(hi for *_, hi in sets)})
        return super().model_kwargs(model, {**kwargs, "generator": generator, "class_specific": False})
