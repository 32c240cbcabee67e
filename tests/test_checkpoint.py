import json

import pytest
import torch

from fl_lightning.core.errors import CheckpointError
from fl_lightning.core.messages import ServerState
from fl_lightning.runtime import checkpoint


def _state(rnd: int) -> ServerState:
    return ServerState(
        round=rnd,
        global_params={"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(4)},
    )


def test_roundtrip_keeps_types_and_values(tmp_path):
    client = {"personal": {"bn.weight": torch.ones(2)}, "moon/prev": {"w": torch.zeros(3)}, "steps": 4}
    index = checkpoint.save_client_states(tmp_path, 1, iter([(3, client)]))
    checkpoint.save(tmp_path, _state(1), {"wandb_id": "abc"}, index)
    state, meta, clients = checkpoint.load(checkpoint.latest(tmp_path))
    assert meta == {"wandb_id": "abc"} and state.round == 1
    assert torch.equal(state.global_params["w"], torch.arange(6.0).reshape(2, 3))
    assert clients == {3: 1}  # int keys survive JSON
    back = checkpoint.load_client_state(tmp_path, 3, clients[3])
    assert set(back) == {"personal", "moon/prev", "steps"} and back["steps"] == 4
    assert torch.equal(back["personal"]["bn.weight"], torch.ones(2))


def test_client_state_files_follow_the_kept_checkpoints(tmp_path):
    """Each client's newest file stays while a kept checkpoint names it; others go."""
    index: dict[int, int] = {}
    for r in range(1, 5):
        trained = [0] if r == 1 else [1]  # client 0 trains only in round 1
        index.update(
            checkpoint.save_client_states(
                tmp_path, r, ((c, {"w": torch.full((2,), float(r))}) for c in trained)
            )
        )
        checkpoint.save(tmp_path, _state(r), {}, index)
    files = sorted(p.name for p in (tmp_path / "checkpoints" / "clients").iterdir())
    assert files == ["c0000000-r000001.pt", "c0000001-r000003.pt", "c0000001-r000004.pt"]
    assert torch.equal(checkpoint.load_client_state(tmp_path, 0, 1)["w"], torch.full((2,), 1.0))
    (tmp_path / "checkpoints" / "clients" / "c0000001-r000004.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="missing or corrupt"):
        checkpoint.load_client_state(tmp_path, 1, 4)


def test_keeps_two_newest_rounds(tmp_path):
    for r in range(1, 5):
        checkpoint.save(tmp_path, _state(r), {})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_file())
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
    with pytest.raises(CheckpointError, match="not a state class of a registered method"):
        checkpoint.load(path)
