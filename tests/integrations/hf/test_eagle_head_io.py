"""The EAGLE-1 head: incremental steps equal the whole-sequence forward; save / load in vLLM's names."""

import pytest

torch = pytest.importorskip("torch")

from tabletune.integrations.hf.eagle_head import (EagleHead, HeadConfig, load_head, load_head_state,  # noqa: E402
                                                  save_head)
from tabletune.errors import InputError  # noqa: E402

TINY = HeadConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48, rope_theta=10000.0,
                  rms_norm_eps=1e-5, vocab_size=97)


def test_forward_kv_one_token_at_a_time_equals_the_whole_sequence():
    torch.manual_seed(0)
    head = EagleHead(TINY)
    head.reset_parameters()
    emb, feat = torch.randn(1, 6, 32), torch.randn(1, 6, 32)
    pos = torch.arange(1, 7)[None]
    whole, _ = head.forward_kv(emb, feat, pos)
    h, past = head.forward_kv(emb[:, :3], feat[:, :3], pos[:, :3])
    for j in range(3, 6):
        h, past = head.forward_kv(emb[:, j: j + 1], feat[:, j: j + 1], pos[:, j: j + 1], past)
        assert torch.allclose(h[:, 0], whole[:, j], atol=1e-5)


def test_save_load_round_trip_in_vllm_names(tmp_path):
    head = EagleHead(TINY)
    head.reset_parameters()
    save_head(head, tmp_path, {"note": "test"}, dtype=torch.float32)
    cfg, state = load_head_state(tmp_path)
    assert cfg == TINY
    assert "fc.weight" in state and "layers.0.self_attn.q_proj.weight" in state
    assert "layers.0.mlp.down_proj.weight" in state and not any("embed" in k or "lm_head" in k for k in state)
    again = load_head(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def test_load_refuses_a_folder_that_is_not_a_head(tmp_path):
    with pytest.raises(InputError, match="tabletune_head.json"):
        load_head_state(tmp_path)
