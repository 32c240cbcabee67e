import json

import pytest
import torch

from fl_lightning.core.errors import CheckpointError
from fl_lightning.core.messages import ClientState, ServerState
from fl_lightning.runtime import checkpoint


def _state(rnd: int) -> ServerState:
    return ServerState(
        round=rnd,
        global_params={"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(4)},
        client_states={3: ClientState(personal_params={"bn.weight": torch.ones(2)})},
    )


def test_roundtrip_keeps_types_and_values(tmp_path):
    checkpoint.save(tmp_path, _state(1), {"wandb_id": "abc"})
    state, meta = checkpoint.load(checkpoint.latest(tmp_path))
    assert meta == {"wandb_id": "abc"} and state.round == 1
    assert torch.equal(state.global_params["w"], torch.arange(6.0).reshape(2, 3))
    assert list(state.client_states) == [3]  # int keys survive JSON
    assert isinstance(state.client_states[3], ClientState)
    assert torch.equal(state.client_states[3].personal_params["bn.weight"], torch.ones(2))


def test_keeps_two_newest_rounds(tmp_path):
    for r in range(1, 5):
        checkpoint.save(tmp_path, _state(r), {})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["round-000003.json", "round-000003.pt", "round-000004.json", "round-000004.pt"]


def test_corrupt_tensor_file_is_a_clear_error(tmp_path):
    checkpoint.save(tmp_path, _state(1), {})
    (tmp_path / "checkpoints" / "round-000001.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="does not match"):
        checkpoint.load(checkpoint.latest(tmp_path))


def test_foreign_json_and_foreign_class_are_rejected(tmp_path):
    path = checkpoint.save(tmp_path, _state(1), {}).with_suffix(".json")
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="not an fl_lightning checkpoint"):
        checkpoint.load(path)
    doc["state"]["__dataclass__"] = "os:system"
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="foreign class"):
        checkpoint.load(path)
