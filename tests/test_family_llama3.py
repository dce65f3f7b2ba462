"""Specs of Llama 3.x read and served by petals 2.2 (``monitor.families.llama3``), checked against the
reference implementation itself (a current transformers, in a child process), never against our code.

The tiny Llama-3.1-style checkpoint (``tiny_model(data_dir, "llama3")``: GQA, head_dim given, an
untied head, ``rope_type: llama3`` with an original context of 256 positions, so the scaling really
changes the rotary frequencies) is served by two petals servers splitting its blocks. Through them,
petals' own client continues prompts greedily exactly as the reference's ``generate`` does, token for
token, for prompts where the reference without the llama3 scaling continues otherwise; the
monitor's local reference blocks (petals' ``load_pretrained_block``) compute the reference's
per-block hidden states. A Llama 2-style checkpoint keeps 4.34's own rotary embedding.
The tokenizer of the checkpoint is not read here (another family module's work): token ids only.
What the config says, with no checkpoint: ``test_family_configs.py``.
"""

from __future__ import annotations

import pytest
import torch

from monitor import compat  # noqa: F401  (must precede petals)
from monitor import families
from monitor.families import llama3
from monitor.harness import reference
from support import require_reference
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_NUM_BLOCKS, tiny_model
from monitor.swarm.correctness import ReferenceModel, relative_error

pytestmark = pytest.mark.filterwarnings(  # petals loads weights into blocks built on the meta device
    "ignore:.*copying from a non-meta parameter:UserWarning")
swarm = pytest.mark.swarm  # (every spec here needs a checkpoint or a swarm; the config ones: test_family_configs.py)

SPECS = (ServerSpec("first-half", 0, TINY_NUM_BLOCKS // 2), ServerSpec("second-half", TINY_NUM_BLOCKS // 2,
                                                                       TINY_NUM_BLOCKS))
NEW_TOKENS = 16
#: candidate prompt lengths: past the original context (256) too, so the rotary cache grows
PROMPT_LENGTHS = (40, 72, 120, 200, 300)
STATE_TOKENS = 300  # positions of the hidden-state comparison
STATE_TOLERANCE = 1e-5  # float32 on both sides; only the order of additions differs


def _prompts(vocabulary: int) -> list[list[int]]:
    """Seeded random ordinary tokens (the special ones sit at the top of the vocabulary)."""
    generator = torch.Generator().manual_seed(31)
    return [torch.randint(0, vocabulary, (length,), generator=generator).tolist() for length in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def checkpoint(data_dir):
    require_reference()
    return tiny_model(data_dir, "llama3")


@pytest.fixture(scope="module")
def config(checkpoint):
    from petals.utils.auto_config import AutoDistributedConfig

    families.install()
    return AutoDistributedConfig.from_pretrained(str(checkpoint.path))


@pytest.fixture(scope="module")
def continuations(checkpoint, config):
    """(prompt, the reference's 16 new tokens) for the candidate prompts it continues to full length
    without an end of text, and where the reference without the llama3 scaling continues otherwise."""
    ordinary = min(config.bos_token_id, config.eos_token_id)
    prompts = _prompts(ordinary)
    scaled = reference.run("reference", {"path": str(checkpoint.path), "generate": prompts,
                                         "max_new_tokens": NEW_TOKENS})["generated"]
    unscaled = reference.run("llama_states", {"path": str(checkpoint.path), "generate": prompts, "unscaled": True,
                                              "max_new_tokens": NEW_TOKENS})["unscaled"]["generated"]
    full = [(prompt, new, plain) for prompt, new, plain in zip(prompts, scaled, unscaled)
            if len(new) == NEW_TOKENS and config.eos_token_id not in new]
    assert full, f"every candidate prompt ends early: {scaled}"
    mattering = [(prompt, new) for prompt, new, plain in full if new != plain]
    assert mattering, "the llama3 scaling changes no continuation: the spec would not see it missing"
    print(f"\nprompts continued to {NEW_TOKENS} tokens: {len(full)} of {len(prompts)}, changed by the scaling: "
          f"{[len(prompt) for prompt, _ in mattering]} tokens long")
    return mattering


@pytest.fixture(scope="module")
def split_swarm(checkpoint):
    with LocalSwarm(checkpoint.path, checkpoint.dht_prefix, update_period=10) as s:
        s.start(SPECS)
        yield s


# ---- the checkpoints -------------------------------------------------------------------------------


@swarm
def test_the_llama3_checkpoint_loads_with_the_references_rotary_frequencies(checkpoint, config):
    from petals.server.from_pretrained import load_pretrained_block

    assert config.model_type == "llama" and llama3.is_llama3(config.rope_scaling)
    assert config.num_key_value_heads < config.num_attention_heads and not config.tie_word_embeddings
    block = load_pretrained_block(str(checkpoint.path), 0, config=config, torch_dtype=torch.float32)
    rotary = block.self_attn.rotary_emb
    assert isinstance(rotary, llama3.Llama3RotaryEmbedding)
    expected = reference.run("llama_states", {"path": str(checkpoint.path), "unscaled": True})
    assert expected["rope_type"] == "llama3"
    assert torch.equal(rotary.inv_freq, torch.tensor(expected["inv_freq"], dtype=torch.float32))  # bit for bit
    assert not torch.equal(rotary.inv_freq, torch.tensor(expected["unscaled"]["inv_freq"], dtype=torch.float32))


@swarm
def test_the_local_reference_blocks_compute_the_references_hidden_states(checkpoint, config):
    """The correctness probes' blocks (petals' load_pretrained_block, fed the checkpoint's embeddings
    of seeded tokens at 300 positions, past the original context) against the reference model's
    ``output_hidden_states``; its last entry is after the final norm, so the last block's output is
    compared with what the reference's last block returned."""
    local = ReferenceModel(checkpoint.path, TINY_NUM_BLOCKS, tokens=STATE_TOKENS)
    states = local.states()
    expected = reference.run("llama_states", {"path": str(checkpoint.path), "unscaled": True,
                                              "inputs_embeds": states[0].tolist()})
    theirs = [torch.tensor(state).unsqueeze(0) for state in expected["hidden_states"][:TINY_NUM_BLOCKS]]
    theirs.append(torch.tensor(expected["last_block"]).unsqueeze(0))
    unscaled = [torch.tensor(state).unsqueeze(0) for state in expected["unscaled"]["hidden_states"]]
    assert len(expected["hidden_states"]) == TINY_NUM_BLOCKS + 1 and torch.equal(theirs[0], states[0])
    for index in range(1, TINY_NUM_BLOCKS + 1):
        error = relative_error(states[index], theirs[index])
        assert error < STATE_TOLERANCE, (index, error)
    assert relative_error(states[1], unscaled[1]) > 0.1  # without the scaling the very first block differs


@swarm
def test_a_llama2_checkpoint_keeps_4_34s_rotary_embedding_and_the_references_states(data_dir):
    from petals.server.from_pretrained import load_pretrained_block
    from petals.utils.auto_config import AutoDistributedConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    require_reference()
    families.install()
    model = tiny_model(data_dir, "llama")
    config = AutoDistributedConfig.from_pretrained(str(model.path))
    assert config.rope_scaling is None and not hasattr(config, "head_dim")
    block = load_pretrained_block(str(model.path), 0, config=config, torch_dtype=torch.float32)
    rotary = block.self_attn.rotary_emb
    assert type(rotary) is LlamaRotaryEmbedding
    head_dim = config.hidden_size // config.num_attention_heads
    plain = LlamaRotaryEmbedding(head_dim, config.max_position_embeddings, config.rope_theta)
    assert rotary.max_seq_len_cached == config.max_position_embeddings
    assert torch.equal(rotary.inv_freq, plain.inv_freq) and torch.equal(rotary.cos_cached, plain.cos_cached)

    local = ReferenceModel(model.path, TINY_NUM_BLOCKS, tokens=64)
    states = local.states()
    expected = reference.run("llama_states", {"path": str(model.path), "inputs_embeds": states[0].tolist()})
    assert expected["rope_type"] == "default"
    assert torch.equal(rotary.inv_freq, torch.tensor(expected["inv_freq"], dtype=torch.float32))
    theirs = [torch.tensor(state).unsqueeze(0) for state in expected["hidden_states"][:TINY_NUM_BLOCKS]]
    theirs.append(torch.tensor(expected["last_block"]).unsqueeze(0))
    for index in range(1, TINY_NUM_BLOCKS + 1):
        assert relative_error(states[index], theirs[index]) < STATE_TOLERANCE, index


# ---- on a real swarm -------------------------------------------------------------------------------


@swarm
def test_petals_client_continues_through_the_swarm_as_the_reference_does(checkpoint, continuations, split_swarm):
    from chat.remote_model import load_remote_model, sequence_manager_of

    model = load_remote_model(checkpoint.path, split_swarm.dht)
    try:
        for prompt, expected in continuations:
            with torch.inference_mode():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
            assert out[0, len(prompt):].tolist() == expected, len(prompt)
    finally:
        sequence_manager_of(model).shutdown()
