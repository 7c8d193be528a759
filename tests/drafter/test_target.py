"""The GGUF loader of the training machine gives exactly the float32 folder's tensors."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")


@pytest.mark.slow
def test_gguf_state_dict_equals_the_float32_folder():
    from safetensors.torch import load_file

    from tabletune.drafter.target import default_gguf, gguf_state_dict
    from tabletune.integrations.hf import smollm2 as assets

    try:
        folder = assets.smollm2_model_dir()
    except Exception as exc:  # the package that carries the weights is missing
        pytest.skip(f"SmolLM2 weights unavailable: {exc}")
    ref = {}
    for f in folder.glob("*.safetensors"):
        ref.update(load_file(str(f)))
    ours = gguf_state_dict(default_gguf(), num_heads=9, num_kv_heads=3)
    assert set(ours) == set(ref)
    assert all(torch.equal(ours[k], ref[k]) for k in ref)
