import torch

from fl_lightning.core.messages import Broadcast, ClientUpdate
from fl_lightning.core.params import add, select, state_nbytes, subtract, weighted_mean


def test_weighted_mean_matches_hand_computation():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(10)}
    b = {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(20)}
    out = weighted_mean([a, b], [1, 3])  # weights 0.25, 0.75
    torch.testing.assert_close(out["w"], torch.tensor([3.25, 6.5]))
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 18  # 2.5 + 15 = 17.5 -> 18
    assert out["w"].dtype == torch.float32


def test_weighted_mean_equal_weights_is_plain_mean_and_order_free():
    torch.manual_seed(0)
    states = [{"w": torch.randn(5, 3)} for _ in range(4)]
    m1 = weighted_mean(states, [7, 7, 7, 7])["w"]
    torch.testing.assert_close(m1, torch.stack([s["w"] for s in states]).mean(0))
    m2 = weighted_mean(states[::-1], [7, 7, 7, 7])["w"]
    torch.testing.assert_close(m1, m2, rtol=0, atol=1e-7)


def test_arithmetic_helpers():
    a = {"x": torch.ones(2), "y": torch.zeros(2)}
    b = {"x": torch.full((2,), 3.0), "y": torch.ones(2)}
    assert torch.equal(subtract(b, a)["x"], torch.full((2,), 2.0))
    assert torch.equal(add(a, b, 0.5)["x"], torch.full((2,), 2.5))
    assert set(select(a, lambda k: k == "x")) == {"x"}
    assert state_nbytes(a) == 16


def test_upload_bytes_count_every_tensor_of_an_update():
    u = ClientUpdate(client_id=0, num_examples=3, params={"w": torch.zeros(10)}, metrics={"train_loss": 1.0})
    assert u.upload_nbytes() == 40
    assert Broadcast(round=1, global_params={"w": torch.zeros(4, dtype=torch.float64)}).nbytes() == 32
