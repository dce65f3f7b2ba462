"""Specs of Llama 3.x's config as petals 2.2 reads it (``monitor.families.llama3``), no checkpoint
needed: registering is idempotent and keeps transformers 4.34's rope scaling spelling; the new
spelling maps to 4.34's or is refused in one line; what 4.34's Llama block cannot compute is refused
in one line naming it. The checkpoints and a swarm serving them: ``test_family_llama3.py``.
"""

from __future__ import annotations

import pytest

from monitor import compat  # noqa: F401  (must precede petals)
from monitor import families
from monitor.families import llama3

pytestmark = pytest.mark.filterwarnings(  # petals loads weights into blocks built on the meta device
    "ignore:.*copying from a non-meta parameter:UserWarning")


def test_register_is_idempotent_and_keeps_the_old_rope_scaling_spelling():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    families.install()
    patched = LlamaConfig._rope_scaling_validation, LlamaAttention._init_rope
    llama3.register()
    assert (LlamaConfig._rope_scaling_validation, LlamaAttention._init_rope) == patched
    assert LlamaConfig(rope_scaling=None).rope_scaling is None
    assert LlamaConfig(rope_scaling={"type": "linear", "factor": 2.0}).rope_scaling == {"type": "linear",
                                                                                       "factor": 2.0}
    with pytest.raises(ValueError, match="two fields"):  # 4.34's own validation, as before
        LlamaConfig(rope_scaling={"type": "linear"})


def test_the_new_rope_scaling_spelling_maps_to_4_34s_or_is_refused_in_one_line():
    from transformers import LlamaConfig

    families.install()
    assert LlamaConfig(rope_scaling={"rope_type": "default"}).rope_scaling is None
    assert LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 4}).rope_scaling == {"type": "linear",
                                                                                          "factor": 4.0}
    assert LlamaConfig(rope_scaling={"rope_type": "dynamic", "type": "dynamic", "factor": 2.0}).rope_scaling == {
        "type": "dynamic", "factor": 2.0}
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    assert LlamaConfig(rope_scaling=dict(scaling)).rope_scaling == scaling
    with pytest.raises(ValueError, match="lacks low_freq_factor") as missing:
        LlamaConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192})
    with pytest.raises(ValueError, match="'yarn' is not supported") as yarn:
        LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert "\n" not in str(missing.value) and "\n" not in str(yarn.value)


def test_what_4_34s_llama_block_cannot_compute_is_refused_in_one_line_naming_it():
    from petals.models.llama.block import WrappedLlamaBlock
    from transformers import LlamaConfig

    families.install()
    tiny = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                num_hidden_layers=1, vocab_size=32)
    with pytest.raises(ValueError, match=r"^head_dim 32 differs from hidden_size / num_attention_heads = 16") as e:
        WrappedLlamaBlock(LlamaConfig(head_dim=32, **tiny))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^mlp_bias"):
        WrappedLlamaBlock(LlamaConfig(mlp_bias=True, **tiny))
    # what it can: head_dim as derived, q/k/v/o biases (the reference's attention_bias)
    block = WrappedLlamaBlock(LlamaConfig(head_dim=16, mlp_bias=False, attention_bias=True, **tiny))
    assert all(getattr(block.self_attn, name).bias is not None for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
